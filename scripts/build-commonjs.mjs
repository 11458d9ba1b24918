// The CommonJS build, dist/cjs, beside the ESM one (dist/lib, from tsconfig.build.json).
//
// TypeScript picks a file's module format from the package.json scope of its *source*: lib/ sits
// in this "type": "module" package, so it always compiles to ESM. The sources are therefore
// copied into a "type": "commonjs" scope and compiled there with the same compiler and options
// (tsconfig.commonjs.json): static imports become require(), while import() of the optional peers
// stays a real import(), as module nodenext does in a CommonJS file. dist/cjs gets its own
// {"type": "commonjs"} so Node and TypeScript read its .js and .d.ts as CommonJS, and the maps
// name lib/ as their sources, like the ESM build's, not the copy.
//
// Each build stages in a directory of its own (mkdtemp), inside dist/ so that the copy resolves
// node_modules and @types exactly as lib/ does and its output can be renamed into place: dist/cjs
// is swapped whole, never half written. tsc's own up-to-date check cannot tell whether dist/cjs is
// fresh, since every path it would record lives in a directory that exists for one build only; a
// hash of what the build reads (the sources, the configs, this script, the compiler's version),
// kept beside dist/cjs, tells instead.
import { createHash } from 'node:crypto';
import { cp, mkdtemp, readdir, readFile, rename, rm, writeFile } from 'node:fs/promises';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { tsc } from './tsc.mjs';

const OUT = 'dist/cjs';
/** The hash of the inputs dist/cjs was built from; outside dist/cjs, which is published. */
const STAMP = 'dist/cjs.inputs-sha256';
const STAGE_PREFIX = 'dist/.commonjs-';
const COMMONJS_SCOPE = '{ "type": "commonjs" }\n';

/**
 * Builds dist/cjs from lib/ unless it was built from exactly these inputs (`force`: always).
 * Call it under the build lock (scripts/build-lock.mjs): it clears the stages of killed builds.
 * Returns whether it built; throws a BuildFailure (scripts/tsc.mjs) when tsc reports errors.
 */
export async function buildCommonJs({ force = false } = {}) {
  await removeLeftoverStages();
  const inputs = await inputsHash();
  const built = await readFile(STAMP, 'utf8').catch(() => undefined);
  const present = await readFile(join(OUT, 'package.json'), 'utf8').catch(() => undefined);
  if (!force && built === inputs && present === COMMONJS_SCOPE) return false;

  const stage = await mkdtemp(STAGE_PREFIX);
  try {
    await cp('lib', join(stage, 'lib'), { recursive: true });
    await writeFile(join(stage, 'package.json'), COMMONJS_SCOPE);
    // Paths in a tsconfig are relative to the file that sets them, so these name the stage.
    await writeFile(
      join(stage, 'tsconfig.json'),
      JSON.stringify({
        extends: resolve('tsconfig.commonjs.json'),
        compilerOptions: { rootDir: 'lib', outDir: 'cjs' },
        include: ['lib'],
        // The command (package.json bin) runs as the ES module it is written as (top-level await).
        exclude: ['lib/cli'],
      }),
    );
    await tsc(['-p', join(stage, 'tsconfig.json')]);
    await writeFile(join(stage, 'cjs', 'package.json'), COMMONJS_SCOPE);
    await pointMapsAtLib(join(stage, 'cjs'), join(stage, 'lib'));
    // Whoever reads dist/cjs meanwhile sees the old build or the new one, never a mix.
    await rename(OUT, join(stage, 'previous')).catch((error) => {
      if (error.code !== 'ENOENT') throw error;
    });
    await rename(join(stage, 'cjs'), OUT);
    await writeFile(STAMP, inputs);
  } finally {
    await rm(stage, { recursive: true, force: true });
  }
  return true;
}

/** SHA-256 over every input of this build, each file by name and content, in a fixed order. */
async function inputsHash() {
  const sources = (await readdir('lib', { recursive: true, withFileTypes: true }))
    .filter((entry) => entry.isFile())
    .map((entry) => join(entry.parentPath, entry.name))
    .sort();
  const files = [...sources, 'tsconfig.json', 'tsconfig.commonjs.json', fileURLToPath(import.meta.url)];
  const hash = createHash('sha256');
  hash.update(JSON.parse(await readFile('node_modules/typescript-native/package.json', 'utf8')).version);
  for (const file of files) hash.update(`\0${relative('.', file)}\0`).update(await readFile(file));
  return hash.digest('hex');
}

/** A build killed mid-way leaves its stage (and the fixed stage older builds used) behind. */
async function removeLeftoverStages() {
  const prefix = STAGE_PREFIX.slice('dist/'.length);
  const entries = await readdir('dist').catch(() => []);
  await Promise.all(
    entries
      .filter((name) => name.startsWith(prefix))
      .map((name) => rm(join('dist', name), { recursive: true, force: true })),
  );
}

/**
 * The maps name their sources relative to the stage's copy; dist/cjs mirrors dist/lib level for
 * level, so each source becomes the same path into lib/ that the ESM build's map holds.
 */
async function pointMapsAtLib(out, copiedLib) {
  for (const file of await readdir(out, { recursive: true })) {
    if (!file.endsWith('.js.map')) continue;
    const path = join(out, file);
    const map = JSON.parse(await readFile(path, 'utf8'));
    map.sources = map.sources.map((source) => {
      const inLib = relative(copiedLib, resolve(dirname(path), source));
      return relative(dirname(resolve(OUT, file)), resolve('lib', inLib));
    });
    await writeFile(path, JSON.stringify(map));
  }
}
