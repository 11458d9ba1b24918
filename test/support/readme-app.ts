import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { Documentation } from './doc-blocks.js';
import type { PackedApp, StartedCommand } from './packed-app.js';
import { freePort } from './postgres-server.js';
import { waitUntil } from './wait-until.js';

/** The folder, inside a packed app, that holds the README's app. */
const README_APP = 'readme-app';
/** The README's files a reader pastes, at the least: its set-up, its webhook and its sender. */
const EXPECTED_FILES = [
  'order.entity.ts',
  'create-orders.migration.ts',
  'app.module.ts',
  'main.ts',
  'stripe-webhook.controller.ts',
  'send-test-event.ts',
];
/** A cold boot runs the migrations: seconds, even on a loaded machine. */
const BOOT_TIMEOUT_MS = 60_000;

/** The README's app, compiled in a packed app, as a reader runs it. */
export interface ReadmeApp {
  /** The files written, by name. */
  files: string[];
  /** `node dist/main.js` with `env` (PORT is chosen here), once it answers HTTP. */
  start(env: Record<string, string>): Promise<RunningReadmeApp>;
  /** Deletes the folder. */
  remove(): Promise<void>;
}

/** The README's app, listening. */
export interface RunningReadmeApp {
  /** Where its webhook is, for the sender's WEBHOOK_URL. */
  webhookUrl: string;
  /** `node dist/send-test-event.js <id>` with `env`: what it printed; rejects, with the app's log, unless it exits 0. */
  send(id: string, env: Record<string, string>): Promise<string>;
  /** What the app printed so far. */
  output(): string;
  stop(): Promise<void>;
}

/**
 * Writes every `file=` block of README.md, exactly as the README shows it, into
 * `readme-app/src/` of `app` (beside its node_modules, so it resolves the installed packages),
 * and compiles it to `readme-app/dist/` with a tsconfig that extends `baseTsconfig` (the app's
 * own, as `nest new` makes it): what a reader who pasted the files into a fresh app and ran
 * `npm run build` has.
 */
export async function buildReadmeApp(
  app: PackedApp,
  docs: Documentation,
  baseTsconfig: string,
): Promise<ReadmeApp> {
  const dir = join(app.dir, README_APP);
  await rm(dir, { recursive: true, force: true });
  await mkdir(join(dir, 'src'), { recursive: true });
  const blocks = docs.blocks.filter((block) => block.file === 'README.md' && block.name !== undefined);
  for (const block of blocks) await writeFile(join(dir, 'src', block.name!), block.code);
  const files = blocks.map((block) => block.name!);
  const missing = EXPECTED_FILES.filter((name) => !files.includes(name));
  if (missing.length > 0) throw new Error(`README.md has no file=${missing.join(', file=')} block`);
  const tsconfig = {
    extends: `../${baseTsconfig}`,
    compilerOptions: {
      rootDir: 'src',
      outDir: 'dist',
      noEmit: false,
      incremental: false,
      declaration: false,
      types: ['node'],
    },
    include: ['src'],
  };
  await writeFile(join(dir, 'tsconfig.json'), JSON.stringify(tsconfig, null, 2) + '\n');
  await app.run('npx', ['tsc', '-p', `${README_APP}/tsconfig.json`]);

  return {
    files,
    async start(env) {
      const port = await freePort();
      const server: StartedCommand = app.start('node', [`${README_APP}/dist/main.js`], {
        ...env,
        PORT: String(port),
      });
      let exitCode: number | null | undefined;
      void server.exited.then((code) => (exitCode = code));
      const origin = `http://127.0.0.1:${port}`;
      try {
        await waitUntil(
          async () => {
            if (exitCode !== undefined) throw new Error(`node dist/main.js exited with ${exitCode}`);
            // Any answer (a 404 for /) means it listens.
            return fetch(origin).then(
              () => true,
              () => false,
            );
          },
          'the README app to listen',
          BOOT_TIMEOUT_MS,
          200,
        );
      } catch (error) {
        await server.stop();
        throw new Error(`${(error as Error).message}; its output:\n${server.output()}`, { cause: error });
      }
      const webhookUrl = `${origin}/webhooks/stripe`;
      return {
        webhookUrl,
        async send(id, sendEnv) {
          try {
            return await app.run('node', [`${README_APP}/dist/send-test-event.js`, id], {
              WEBHOOK_URL: webhookUrl,
              ...sendEnv,
            });
          } catch (error) {
            throw new Error(`${(error as Error).message}\nThe app's output:\n${server.output()}`, {
              cause: error,
            });
          }
        },
        output: () => server.output(),
        stop: () => server.stop(),
      };
    },
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

/** What the README's three commands did against an empty database. */
export interface ReadmeRun {
  /** Tables in the database before the app booted (none: it is empty). */
  tablesBefore: string[];
  /** What the sender printed, first and second time, for the same event. */
  first: string;
  second: string;
  /** The orders table after the second send. */
  orders: { stripe_event_id: string; amount: number }[];
  /** The claims after the second send. */
  claims: { scope: string; event_key: string; status: string }[];
}

/** The secret the app and the sender share, as the README's `export` line has it. */
const SECRET = 'whsec_local_test';

/**
 * The README's "A first event", in `app`: its files compiled against `baseTsconfig`,
 * `node dist/main.js` on `database` (empty), the same event sent twice with the README's sender.
 */
export async function runReadmeCommands(
  app: PackedApp,
  docs: Documentation,
  baseTsconfig: string,
  database: { url: string; pool: { query(sql: string): Promise<{ rows: unknown[] }> } },
  eventId: string,
): Promise<ReadmeRun> {
  const tables = async () =>
    (
      (
        await database.pool.query(
          `SELECT tablename FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1`,
        )
      ).rows as { tablename: string }[]
    ).map((row) => row.tablename);
  const tablesBefore = await tables();
  const readme = await buildReadmeApp(app, docs, baseTsconfig);
  try {
    const running = await readme.start({ DATABASE_URL: database.url, STRIPE_WEBHOOK_SECRET: SECRET });
    try {
      const first = await running.send(eventId, { STRIPE_WEBHOOK_SECRET: SECRET });
      const second = await running.send(eventId, { STRIPE_WEBHOOK_SECRET: SECRET });
      const orders = (await database.pool.query('SELECT stripe_event_id, amount FROM orders ORDER BY id'))
        .rows as ReadmeRun['orders'];
      const claims = (await database.pool.query('SELECT scope, event_key, status FROM processed_events'))
        .rows as ReadmeRun['claims'];
      return { tablesBefore, first, second, orders, claims };
    } finally {
      await running.stop();
    }
  } finally {
    await readme.remove();
  }
}
