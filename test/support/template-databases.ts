import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { FIXTURE_SCHEMA } from '../fixtures/webhook-fixture.module.js';
import { createMigratedDatabase } from './migrated-database.js';

/**
 * Where global setup leaves the names of the run's template databases, for the workers: one with
 * the library's migrations and the fixture tables, one with the migrations alone.
 */
export const TEMPLATE_ENV = {
  fixtures: 'TEST_TEMPLATE_DATABASE',
  bare: 'TEST_TEMPLATE_DATABASE_BARE',
} as const;

/** The run's template databases, made once by global setup. */
export interface TemplateDatabases {
  fixtures: string;
  bare: string;
  /** Drops both (on a DATABASE_URL server they would outlive the run). */
  drop(): Promise<void>;
}

/**
 * Runs the library's migrations once per run, into two template databases that every test file's
 * database is then copied from (`CREATE DATABASE ... TEMPLATE`): a copy takes about 25 ms, the
 * migrations about 250 ms, and a run makes about a hundred databases. The copy is the migrated
 * state itself, `migrations` table included, so a test sees what a migrated app's database holds.
 */
export async function createTemplateDatabases(adminUrl: string): Promise<TemplateDatabases> {
  const suffix = randomBytes(4).toString('hex');
  const [fixtures, bare] = await Promise.all([
    createMigratedDatabase(adminUrl, `idem_template_${suffix}`, FIXTURE_SCHEMA),
    createMigratedDatabase(adminUrl, `idem_template_bare_${suffix}`),
  ]);
  return {
    fixtures: fixtures.name,
    bare: bare.name,
    async drop() {
      const admin = new pg.Client({ connectionString: adminUrl });
      await admin.connect();
      try {
        for (const name of [fixtures.name, bare.name]) await admin.query(`DROP DATABASE IF EXISTS ${name}`);
      } finally {
        await admin.end();
      }
    },
  };
}
