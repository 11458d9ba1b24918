import request from 'supertest';
import { Gates } from '../fixtures/webhook-fixture.module.js';
import type { RunningApp } from './app.js';

/** A delivery parked at its gate, after its claim, until the test opens it. */
export interface ParkedDelivery {
  /** Its answer, once the gate is opened. Wrapped: an async function resolving to it would wait for it. */
  answer: Promise<request.Response>;
  /** The gates of the app it is parked in: `gates.open(id)` lets it go on. */
  gates: Gates;
}

/** Sends `body` to `path` with `block: true` and resolves once its handler is parked at its gate. */
export async function parkDelivery(
  running: RunningApp,
  path: string,
  body: { id: string } & Record<string, unknown>,
): Promise<ParkedDelivery> {
  const gates = running.app.get(Gates);
  const answer = request(running.url)
    .post(path)
    .send({ ...body, block: true })
    .then((response) => response);
  await gates.entered(body.id);
  return { answer, gates };
}
