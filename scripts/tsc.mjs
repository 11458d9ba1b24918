// Runs the TypeScript 7 compiler (typescript-native) for the build scripts.
import { spawn } from 'node:child_process';

const TSC = 'node_modules/typescript-native/bin/tsc';

/** tsc exited non-zero; it has printed its diagnostics, so a stack trace would only hide them. */
export class BuildFailure extends Error {
  constructor(args, status) {
    super(`tsc ${args.join(' ')} exited with ${status}`);
    this.status = typeof status === 'number' ? status : 1;
  }
}

/**
 * Runs tsc with `args`, its output on ours. In a child process, not execFileSync: the build lock
 * must keep answering the builds that wait for it (scripts/build-lock.mjs).
 */
export function tsc(args) {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [TSC, ...args], { stdio: 'inherit' });
    child.once('error', fail);
    child.once('exit', (code, signal) =>
      code === 0 ? done() : fail(new BuildFailure(args, code ?? signal)),
    );
  });
}
