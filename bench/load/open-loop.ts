import { setTimeout as sleep } from 'node:timers/promises';
import { postJson, type keepAliveAgent, type PostAnswer } from './http-post.js';

/** How often the sender wakes to send what has come due, in ms. */
const TICK_MS = 2;

/** One open-loop run against one path. */
export interface OpenLoopOptions {
  agent: ReturnType<typeof keepAliveAgent>;
  url: string;
  path: string;
  /** Requests a second, evenly spaced. */
  rate: number;
  /** How long to send, in ms. */
  ms: number;
  /** The body of the request with this sequence number (from 0). */
  body: (sequence: number) => string;
}

/**
 * A steady open loop: request n is due n/rate s after the start and is sent then, whatever the
 * answers to the earlier ones (a sender's retries do not wait for the server either). Each latency
 * counts from when its request was due, so a server that falls behind shows it instead of slowing
 * the sender down (no coordinated omission). Resolves with every answer once all have come.
 *
 * Not autocannon's `overallRate`: that gives each connection a budget per second, which it spends
 * back to back as soon as the second starts, so a "steady" 80/s arrives as a burst of 32 at the
 * top of each second and its latency is mostly that burst's queue.
 */
export async function openLoop(options: OpenLoopOptions): Promise<PostAnswer[]> {
  const answers: Promise<PostAnswer>[] = [];
  const started = performance.now();
  let sent = 0;
  while (performance.now() - started < options.ms) {
    // Everything due by now: request n is due at n / rate s, the first at once.
    const due = Math.floor(((performance.now() - started) / 1000) * options.rate) + 1;
    for (; sent < due; sent++) {
      const dueAt = started + (sent * 1000) / options.rate;
      answers.push(postJson(options.agent, options.url, options.path, options.body(sent), dueAt));
    }
    await sleep(TICK_MS);
  }
  return Promise.all(answers);
}
