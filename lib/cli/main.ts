#!/usr/bin/env node
/**
 * The `nest-idempotent-webhooks` command (package.json `bin`): `claims list|show|release|forget`
 * against the database in DATABASE_URL. See `claims --help`.
 */
import { runClaimsCommand } from './claims.command.js';

// exitCode, not exit(): stdout is a pipe in scripts, and exit() could cut its last write short.
process.exitCode = await runClaimsCommand(process.argv.slice(2), process.env, {
  out: (text) => void process.stdout.write(text),
  err: (text) => void process.stderr.write(text),
});
