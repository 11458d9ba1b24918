// The CommonJS build, dist/cjs, beside the ESM one (dist/lib, from tsconfig.build.json).
//
// TypeScript picks a file's module format from the package.json scope of its *source*: lib/ sits
// in this "type": "module" package, so it always compiles to ESM. The sources are therefore
// copied into a "type": "commonjs" scope (dist/.commonjs-src) and compiled there with the same
// compiler and options (tsconfig.commonjs.json): static imports become require(), while import()
// of the optional peers stays a real import(), as module nodenext does in a CommonJS file.
// dist/cjs gets its own {"type": "commonjs"} so Node and TypeScript read its .js and .d.ts as
// CommonJS, and the maps name lib/ as their sources, like the ESM build's, not the copy.
import { execFileSync } from 'node:child_process';
import { cp, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

const STAGE = 'dist/.commonjs-src';
const OUT = 'dist/cjs';
const COMMONJS_SCOPE = '{ "type": "commonjs" }\n';

await Promise.all([rm(STAGE, { recursive: true, force: true }), rm(OUT, { recursive: true, force: true })]);
await mkdir(STAGE, { recursive: true });
await cp('lib', join(STAGE, 'lib'), { recursive: true });
await writeFile(join(STAGE, 'package.json'), COMMONJS_SCOPE);

try {
  execFileSync(process.execPath, ['node_modules/typescript-native/bin/tsc', '-p', 'tsconfig.commonjs.json'], {
    stdio: 'inherit',
  });
} catch (error) {
  // tsc has printed its diagnostics; a stack trace of this script would only hide them.
  process.exit(error.status ?? 1);
}
await writeFile(join(OUT, 'package.json'), COMMONJS_SCOPE);

// dist/cjs mirrors dist/lib level for level, so a source's path relative to its map is the same
// string in both builds once the staging directory is taken out of it.
for (const file of await readdir(OUT, { recursive: true })) {
  if (!file.endsWith('.js.map')) continue;
  const path = join(OUT, file);
  const map = JSON.parse(await readFile(path, 'utf8'));
  map.sources = map.sources.map((source) => source.replace('/.commonjs-src/lib/', '/../lib/'));
  await writeFile(path, JSON.stringify(map));
}
await rm(STAGE, { recursive: true, force: true });
