import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { chromium, type BrowserContext } from 'playwright-core';
import { CHROMIUM, requireProgram } from './system-packages.js';

/**
 * Flags for a headless Chromium that talks to nothing but the pages it is sent to: no GPU, no
 * QUIC, no first-run, sync, component or background requests (the machine reaches no network but
 * the test's 127.0.0.1 servers).
 */
const FLAGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

/** A real Chromium (Debian's package, never a downloaded build), with a profile of its own. */
export interface Browser {
  context: BrowserContext;
  close(): Promise<void>;
}

/**
 * Starts Debian's chromium through playwright-core in a fresh profile directory (removed on
 * close), sending `headers` with every request (the console's guard reads one).
 */
export async function launchBrowser(headers: Record<string, string> = {}): Promise<Browser> {
  const profile = await mkdtemp(join(tmpdir(), 'chromium-profile-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: requireProgram(CHROMIUM),
    headless: true,
    args: FLAGS,
    extraHTTPHeaders: headers,
    viewport: { width: 1280, height: 900 },
    deviceScaleFactor: 1,
    timeout: 60_000,
  });
  return {
    context,
    async close() {
      await context.close();
      await rm(profile, { recursive: true, force: true });
    },
  };
}
