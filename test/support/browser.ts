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

/** What the browser sends of its own accord. */
export interface BrowserOptions {
  /** Sent with every request. */
  headers?: Record<string, string>;
  /** What a person would type into the browser's sign-in prompt when a page asks (401 + Basic). */
  httpCredentials?: { username: string; password: string };
}

/**
 * Starts Debian's chromium through playwright-core in a fresh profile directory (removed on
 * close), sending `headers` with every request and answering a sign-in prompt with
 * `httpCredentials` (the console's token check reads either).
 */
export async function launchBrowser({
  headers = {},
  httpCredentials,
}: BrowserOptions = {}): Promise<Browser> {
  const profile = await mkdtemp(join(tmpdir(), 'chromium-profile-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: requireProgram(CHROMIUM),
    headless: true,
    args: FLAGS,
    extraHTTPHeaders: headers,
    httpCredentials,
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
