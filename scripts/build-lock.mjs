// One build of a checkout at a time. Two `npm run sample` started together (two replicas of a
// multi-instance trial) would otherwise write the same files in dist/ at once, and one could start
// its app on the other's half-written output.
//
// The lock is a listening Unix socket, not a file: the kernel closes a socket the moment its process
// dies, SIGKILL included, so a killed build never leaves a lock behind that someone must judge stale.
// On Linux the socket has an abstract name (no file at all). Elsewhere it is a socket file in the
// temporary directory, which a killed build does leave behind; a file that nobody answers on is
// stale and is removed (two waiters doing that at the same instant after a kill is the one race
// left, and only there).
import { createHash } from 'node:crypto';
import { realpathSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { connect, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

/** How long a build waits for another build of its checkout: builds take seconds. */
const WAIT_LIMIT_MS = 300_000;
/** Turns at the lock before giving up; each turn waits for the holder to go, so few are needed. */
const MAX_TURNS = 1_000;

/**
 * The lock's socket address for `checkout`, one per checkout (two clones build side by side).
 * `platform` picks the kind: an abstract name on Linux, a socket file elsewhere.
 */
export function buildLockAddress(checkout, platform = process.platform) {
  const id = createHash('sha256').update(realpathSync(checkout)).digest('hex').slice(0, 16);
  const name = `nest-idempotent-webhooks-build-${id}`;
  return platform === 'linux' ? `\0${name}` : join(tmpdir(), `${name}.sock`);
}

/**
 * Runs `work` while holding the build lock of `checkout`, waiting (at most 5 minutes) while
 * another process holds it; `onWait(pid)` is told once, with the holder's pid, when it has to.
 * `address` defaults to buildLockAddress(checkout).
 */
export async function withBuildLock(checkout, work, { onWait = () => undefined, address } = {}) {
  const lock = address ?? buildLockAddress(checkout);
  const deadline = Date.now() + WAIT_LIMIT_MS;
  let told = false;
  for (let turn = 0; turn < MAX_TURNS && Date.now() < deadline; turn++) {
    const held = await listen(lock);
    if (held) {
      try {
        return await work();
      } finally {
        await held.release();
      }
    }
    const outcome = await waitForRelease(lock, deadline, (pid) => {
      if (!told) onWait(pid);
      told = true;
    });
    // Only a socket file can be stale: an abstract name goes with its process.
    if (outcome === 'stale') await rm(lock, { force: true });
  }
  throw new Error(
    `Another build of ${checkout} held the build lock for ${WAIT_LIMIT_MS / 1000} s; is a build stuck?`,
  );
}

/** Takes the lock, or returns undefined when someone else has it. */
function listen(address) {
  const clients = new Set();
  // Whoever waits connects and is told the holder's pid; its connection closes when the lock does.
  const server = createServer((socket) => {
    clients.add(socket);
    socket.on('close', () => clients.delete(socket));
    socket.on('error', () => undefined);
    socket.write(`${process.pid}\n`);
  });
  return new Promise((resolve, reject) => {
    server.once('error', (error) => (error.code === 'EADDRINUSE' ? resolve(undefined) : reject(error)));
    server.listen(address, () =>
      resolve({
        release: () =>
          new Promise((done) => {
            server.close(() => done());
            for (const socket of clients) socket.destroy();
          }),
      }),
    );
  });
}

/**
 * Connects to the holder, hands its pid to `onPid`, and resolves once the connection closes: the
 * holder released the lock or its process died ('released'), or, for a socket file nobody listens
 * on (its build was killed), 'stale'. At `deadline` it stops waiting ('released' too: the caller
 * sees the deadline passed).
 */
function waitForRelease(address, deadline, onPid) {
  return new Promise((resolve) => {
    const socket = connect(address);
    const timer = setTimeout(() => socket.destroy(), Math.max(0, deadline - Date.now()));
    const settle = (outcome) => {
      clearTimeout(timer);
      resolve(outcome);
    };
    socket.setEncoding('utf8');
    socket.on('data', (text) => onPid(Number.parseInt(text, 10)));
    socket.once('error', (error) =>
      // ECONNREFUSED on an abstract name only means its holder just left.
      settle(error.code === 'ECONNREFUSED' && !address.startsWith('\0') ? 'stale' : 'released'),
    );
    socket.once('close', () => settle('released'));
  });
}
