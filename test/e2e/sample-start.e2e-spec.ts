import { spawn } from 'node:child_process';
import { appendFile, readdir, readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { holdBuildLock } from '../support/build-lock-holder.js';
import { copyCheckout, type CheckoutCopy } from '../support/checkout-copy.js';
import { createTestDatabase, type TestDatabase } from '../support/database.js';
import { spawnNpmSample, type NpmSample } from '../support/npm-sample-process.js';
import { waitUntil } from '../support/wait-until.js';

const ESM_BUILT = 'build: ESM (dist/lib, dist/sample, dist/test) built';
const ESM_FRESH = 'build: ESM (dist/lib, dist/sample, dist/test) up to date';
const CJS_BUILT = 'build: CommonJS (dist/cjs) built';
const CJS_FRESH = 'build: CommonJS (dist/cjs) up to date';

// Each test builds and boots the sample (twice at most): longer than the run's default.
jest.setTimeout(240_000);

/** Every file under `dir` with when it was last written: what a build that does nothing leaves alone. */
async function writtenAt(dir: string): Promise<Record<string, number>> {
  const files: Record<string, number> = {};
  for (const entry of await readdir(dir, { recursive: true, withFileTypes: true })) {
    if (entry.isFile()) {
      const path = join(entry.parentPath, entry.name);
      files[path.slice(dir.length + 1)] = (await stat(path)).mtimeMs;
    }
  }
  return files;
}

/** `node scripts/build.mjs` in `cwd`, in a process group of its own (it runs tsc as a child). */
function startBuild(cwd: string, args: string[] = []) {
  const env: NodeJS.ProcessEnv = { ...process.env };
  delete env.NODE_OPTIONS;
  const child = spawn(process.execPath, ['scripts/build.mjs', ...args], {
    cwd,
    env,
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<number | null>((done) => child.once('exit', (code) => done(code)));
  return { child, exited, output: () => output };
}

/**
 * `npm run sample` as replicas start it: two at once from one checkout, on a build that is stale.
 * They must not race in dist/ (before, both compiled at once and one failed in the CommonJS
 * build's shared staging folder), and a start with nothing changed must not rebuild. Each test
 * works on a copy of the checkout in a temporary directory, so the dist/ that the run's other
 * test files load is never stale or half written; the samples share one database, as replicas do.
 */
describe('npm run sample: starting like an app', () => {
  let checkout: CheckoutCopy;
  let db: TestDatabase;
  const samples: NpmSample[] = [];
  const start = async () => {
    const sample = await spawnNpmSample(checkout.dir, db.url);
    samples.push(sample);
    return sample;
  };
  const dist = () => join(checkout.dir, 'dist');

  beforeAll(async () => {
    checkout = await copyCheckout();
    // The sample's own migration creates `orders`; the fixture tables would be in its way.
    db = await createTestDatabase(undefined, { fixtureSchema: false });
  });

  afterEach(async () => {
    await Promise.all(samples.splice(0).map((sample) => sample.stop()));
  });

  afterAll(async () => {
    await Promise.all(samples.splice(0).map((sample) => sample.kill()));
    await db?.drop();
    await checkout?.remove();
  });

  it('two starts at once on a stale build: one builds while the other waits for it, and both serve', async () => {
    // Holding the build lock until both starts wait for it makes them reach the build together,
    // whatever the machine's load; then the lock is theirs to fight over.
    const gate = holdBuildLock(checkout.dir);
    await gate.held();
    const [first, second] = await Promise.all([start(), start()]);
    const waitingForGate = `build: waiting for the build already running in this checkout (pid ${gate.pid})`;
    await Promise.all([first.said(waitingForGate), second.said(waitingForGate)]);
    expect(await gate.release()).toBe(0);

    await Promise.all([first.ready(), second.ready()]);
    const outputs = [first.output(), second.output()];
    // Exactly one of them compiled; the other found that build fresh when its turn came.
    const builders = outputs.filter((output) => output.includes(ESM_BUILT));
    const waiters = outputs.filter((output) => output.includes(ESM_FRESH));
    expect([builders.length, waiters.length]).toEqual([1, 1]);
    expect(builders[0]).toContain(CJS_BUILT);
    expect(waiters[0]).toContain(CJS_FRESH);
    expect(waiters[0]).not.toContain(CJS_BUILT);
    for (const output of outputs) expect(output).not.toMatch(/error TS\d+/);
  });

  it('a start with nothing changed builds nothing: no output of either build is rewritten', async () => {
    const before = await writtenAt(dist());
    expect(Object.keys(before)).toEqual(
      expect.arrayContaining(['lib/index.js', 'sample/main.js', 'cjs/index.js', 'cjs/package.json']),
    );

    const sample = await start();
    await sample.ready();
    expect(sample.output()).toContain(ESM_FRESH);
    expect(sample.output()).toContain(CJS_FRESH);
    expect(await writtenAt(dist())).toEqual(before);
  });

  it('an edited source rebuilds both builds, and the next build finds them fresh', async () => {
    const marker = `// edited by the sample-start test ${Date.now()}`;
    await appendFile(join(checkout.dir, 'lib/index.ts'), `${marker}\n`);
    const build = startBuild(checkout.dir);
    expect(await build.exited).toBe(0);
    expect(build.output()).toContain(ESM_BUILT);
    expect(build.output()).toContain(CJS_BUILT);
    expect(await readFile(join(dist(), 'lib/index.js'), 'utf8')).toContain(marker);
    expect(await readFile(join(dist(), 'cjs/index.js'), 'utf8')).toContain(marker);
    // The maps still name lib/ (not the stage the CommonJS copy was compiled in).
    const map = JSON.parse(await readFile(join(dist(), 'cjs/index.js.map'), 'utf8'));
    expect(map.sources).toEqual(['../../lib/index.ts']);

    const again = startBuild(checkout.dir);
    expect(await again.exited).toBe(0);
    expect(again.output()).toContain(ESM_FRESH);
    expect(again.output()).toContain(CJS_FRESH);
  });

  it('a build SIGKILLed mid-way holds up no later start, and its leftovers are cleared', async () => {
    const killed = startBuild(checkout.dir, ['--force']);
    // Its CommonJS stage exists: it holds the lock and is writing (the ESM build is done).
    await waitUntil(
      async () => (await readdir(dist())).some((name) => name.startsWith('.commonjs-')),
      "the forced build's CommonJS stage in dist/",
      60_000,
      20,
    );
    process.kill(-killed.child.pid!, 'SIGKILL');
    await killed.exited;
    expect((await readdir(dist())).filter((name) => name.startsWith('.commonjs-'))).toHaveLength(1);

    const sample = await start();
    await sample.ready();
    expect(sample.output()).not.toContain('waiting for the build');
    // The killed build never swapped dist/cjs, so the complete one it found is still fresh.
    expect(sample.output()).toContain(CJS_FRESH);
    expect((await readdir(dist())).filter((name) => name.startsWith('.commonjs-'))).toEqual([]);
  });
});
