import { execFile } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { EmbeddedCluster } from '../../sample/database/embedded-cluster.js';

/** The superuser and password of every PostgreSQL server the tests start. */
export const SERVER_SUPERUSER = { user: 'postgres', password: 'postgres' } as const;

/**
 * Where global setup leaves the run's cluster template (its data directory), for the workers:
 * each server a test file starts of its own is a copy of it.
 */
export const CLUSTER_TEMPLATE_ENV = 'TEST_POSTGRES_CLUSTER_TEMPLATE';

/** An initialised, never started data directory that servers are copied from. */
export interface ClusterTemplate {
  readonly dataDir: string;
  /** Removes it; nothing for the run's template borrowed by a test file (global teardown removes that). */
  remove(): Promise<void>;
}

const execFileAsync = promisify(execFile);

/**
 * Runs initdb once, into a directory servers are copied from: initdb takes about 1.6 s on this
 * machine, a copy of its output about 80 ms, and a run starts several servers of their own.
 */
export async function createClusterTemplate(): Promise<ClusterTemplate> {
  const parent = await sharedDirectory('idempotency-pg-template-');
  const dataDir = join(parent, 'data');
  const cluster = new EmbeddedCluster({ dataDir, port: 0, ...SERVER_SUPERUSER });
  try {
    await cluster.initialise();
  } catch (error) {
    await rm(parent, { recursive: true, force: true });
    throw error;
  }
  return { dataDir, remove: () => rm(parent, { recursive: true, force: true }) };
}

/**
 * The run's template when global setup made one (it is left to global teardown to remove),
 * otherwise one of the caller's own (a run outside jest, or embedded binaries that failed in
 * global setup: then this fails too, here, with initdb's own message).
 */
export async function acquireClusterTemplate(): Promise<ClusterTemplate> {
  return runClusterTemplate() ?? createClusterTemplate();
}

/** The template global setup made for the run, if it made one; global teardown removes it. */
export function runClusterTemplate(): ClusterTemplate | undefined {
  const dataDir = process.env[CLUSTER_TEMPLATE_ENV];
  return dataDir ? { dataDir, remove: async () => undefined } : undefined;
}

/**
 * Makes `dataDir` (which must not exist) a copy of the template: the same files initdb would have
 * written there. `cp -a` keeps owner and mode: as root the copy stays the `postgres` user's, 0700.
 */
export async function copyClusterTemplate(template: ClusterTemplate, dataDir: string): Promise<void> {
  await execFileAsync('cp', ['-a', template.dataDir, dataDir]);
}

/** A fresh directory under the temporary one that the `postgres` user may traverse (as root). */
export async function sharedDirectory(prefix: string): Promise<string> {
  const parent = await mkdtemp(join(tmpdir(), prefix));
  await chmod(parent, 0o755);
  return parent;
}
