// `npm run build` (and `npm run sample`, and `npm test` before its run): the ESM build
// (tsconfig.build.json: dist/lib, dist/sample, dist/test) and the CommonJS build (dist/cjs), each
// only when its inputs changed, and one build of a checkout at a time, so that two starts at once
// never write dist/ together and the second finds the first's build fresh.
//
// The ESM build is `tsc -b`: tsc keeps what it compiled in dist/tsconfig.build.tsbuildinfo and
// does nothing when no input (source, tsconfig, compiler) is newer than its outputs and none is
// missing. `--force` rebuilds both.
import { stat } from 'node:fs/promises';
import { buildCommonJs } from './build-commonjs.mjs';
import { withBuildLock } from './build-lock.mjs';
import { BuildFailure, tsc } from './tsc.mjs';

const ESM_BUILD_INFO = 'dist/tsconfig.build.tsbuildinfo';
const force = process.argv.includes('--force');

try {
  await withBuildLock(process.cwd(), build, {
    onWait: (pid) =>
      console.log(`build: waiting for the build already running in this checkout (pid ${pid})`),
  });
} catch (error) {
  if (!(error instanceof BuildFailure)) throw error;
  process.exitCode = error.status;
}

async function build() {
  const before = await modified(ESM_BUILD_INFO);
  await tsc(['-b', 'tsconfig.build.json', ...(force ? ['--force'] : [])]);
  const esm = (await modified(ESM_BUILD_INFO)) === before ? 'up to date' : 'built';
  console.log(`build: ESM (dist/lib, dist/sample, dist/test) ${esm}`);
  const commonjs = (await buildCommonJs({ force })) ? 'built' : 'up to date';
  console.log(`build: CommonJS (dist/cjs) ${commonjs}`);
}

/** When `file` was last written, or undefined when it does not exist. */
async function modified(file) {
  return (await stat(file).catch(() => undefined))?.mtimeMs;
}
