import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { resolve } from 'node:path';

/** The built CLI, where package.json's `bin` points: what `npx nest-idempotent-webhooks` runs. */
export const CLI_ENTRY = resolve(
  (JSON.parse(readFileSync('package.json', 'utf8')) as { bin: Record<string, string> }).bin[
    'nest-idempotent-webhooks'
  ],
);

/** What one CLI run did. */
export interface CliRun {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** A CLI run never takes this long; past it the child is killed and the test fails. */
const CLI_TIMEOUT_MS = 30_000;

/**
 * Runs `nest-idempotent-webhooks <args>` as a real child process (node on the built CLI) with
 * `env` added to a copy of this process's environment (a key set to undefined is removed).
 */
export function runClaimsCli(args: string[], env: Record<string, string | undefined>): Promise<CliRun> {
  const environment: NodeJS.ProcessEnv = { ...process.env, ...env };
  for (const [name, value] of Object.entries(env)) if (value === undefined) delete environment[name];
  // NODE_OPTIONS carries jest's --experimental-vm-modules, which would warn on stderr.
  delete environment.NODE_OPTIONS;
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [CLI_ENTRY, ...args], {
      env: environment,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk) => (stdout += chunk));
    child.stderr.on('data', (chunk) => (stderr += chunk));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      fail(new Error(`CLI ${args.join(' ')} ran longer than ${CLI_TIMEOUT_MS} ms:\n${stdout}\n${stderr}`));
    }, CLI_TIMEOUT_MS);
    child.on('error', fail);
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
  });
}
