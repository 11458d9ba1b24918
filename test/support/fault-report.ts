import { expect } from '@jest/globals';
import type { CountingDownstream } from './counting-downstream.js';
import type { TestDatabase } from './database.js';
import { isRetryLater, type SendOutcome, type SenderResult } from './retrying-sender.js';

/** What one fault test measured, besides the sender's own record. */
export interface FaultReportInput {
  /** The fault, for the report's first line. */
  fault: string;
  mode: 'transaction' | 'external';
  /** The claim scope of the route driven (`FaultsController.order` or `.external`). */
  scope: string;
  sent: SenderResult;
  db: TestDatabase;
  /** External mode: the downstream whose calls are the effect. */
  downstream?: CountingDownstream;
  /** Pids of app processes SIGKILLed during the run: their calls may be repeated by a re-claim. */
  killedPids?: ReadonlySet<number>;
}

/** The figures every fault test prints and asserts. */
export interface FaultReport {
  eventsSent: number;
  deliveries: number;
  duplicates: number;
  sends: number;
  /** Answers by status (`200`, `200 replayed`, `409`, `503`, `no answer` for a transport failure). */
  answers: Record<string, number>;
  /** Answers that are neither 2xx nor "retry later" (503/409 with Retry-After, no answer): 500s, a bare 503. */
  unexpectedAnswers: SendOutcome[];
  /** Deliveries still without a 2xx at the sender's deadline. */
  unsettledDeliveries: number;
  /** Events never acknowledged 2xx, or acknowledged with no effect. */
  eventsLost: string[];
  /** Events with more than one `orders` row. */
  effectsDoubled: string[];
  /** Acknowledged events whose claim is not `done`: a lease left to expire (and run again). */
  unfinishedClaims: string[];
  /** Downstream calls beyond one per event. */
  extraDownstreamCalls: number;
  /** Extra calls whose earlier call did not come from a process that was SIGKILLed. */
  extraCallsUnexplained: number;
}

/**
 * Reads the effects (orders rows, downstream calls, claim rows) of the events the sender
 * delivered, prints the report one figure a line, and returns it for the test's assertions.
 */
export async function faultReport(input: FaultReportInput): Promise<FaultReport> {
  const { sent, db, downstream } = input;
  const ids = sent.eventIds;
  const orderRows = new Map<string, number>(
    (
      await db.pool.query<{ event_id: string; n: string }>(
        'SELECT event_id, count(*) AS n FROM orders WHERE event_id = ANY($1) GROUP BY event_id',
        [ids],
      )
    ).rows.map((row) => [row.event_id, Number(row.n)]),
  );
  const claimStatus = new Map<string, string>(
    (
      await db.pool.query<{ event_key: string; status: string }>(
        'SELECT event_key, status FROM processed_events WHERE scope = $1 AND event_key = ANY($2)',
        [input.scope, ids],
      )
    ).rows.map((row) => [row.event_key, row.status]),
  );
  const calls = downstream?.countsByEvent() ?? new Map<string, number>();

  const acknowledged = new Set(sent.deliveries.filter((d) => d.settled).map((d) => d.eventId));
  const sends = sent.deliveries.flatMap((delivery) => delivery.sends);
  const answers: Record<string, number> = {};
  for (const outcome of sends) {
    const label =
      outcome.status === 0 ? 'no answer' : `${outcome.status}${outcome.replayed ? ' replayed' : ''}`;
    answers[label] = (answers[label] ?? 0) + 1;
  }
  const effect = (id: string) =>
    input.mode === 'transaction' ? (orderRows.get(id) ?? 0) : (calls.get(id) ?? 0);

  let extraDownstreamCalls = 0;
  let extraCallsUnexplained = 0;
  const keysPerEvent = new Map<string, Set<string | undefined>>();
  for (const id of ids) {
    const made = downstream?.callsFor(id) ?? [];
    keysPerEvent.set(id, new Set(made.map((call) => call.idempotencyKey)));
    if (made.length <= 1) continue;
    extraDownstreamCalls += made.length - 1;
    // A call is repeated only when its lease was re-claimed: its caller never completed it. That
    // is expected of a caller that was SIGKILLed, and of nothing else.
    extraCallsUnexplained += made
      .slice(0, -1)
      .filter((call) => !input.killedPids?.has(call.callerPid ?? -1)).length;
  }

  const report: FaultReport = {
    eventsSent: ids.length,
    deliveries: sent.deliveries.length,
    duplicates: sent.deliveries.filter((delivery) => delivery.kind !== 'first').length,
    sends: sends.length,
    answers,
    unexpectedAnswers: sends.filter(
      (outcome) => !(outcome.status >= 200 && outcome.status < 300) && !isRetryLater(outcome),
    ),
    unsettledDeliveries: sent.deliveries.filter((delivery) => !delivery.settled).length,
    eventsLost: ids.filter((id) => !acknowledged.has(id) || effect(id) === 0),
    effectsDoubled: ids.filter((id) => (orderRows.get(id) ?? 0) > 1),
    unfinishedClaims: ids.filter((id) => acknowledged.has(id) && claimStatus.get(id) !== 'done'),
    extraDownstreamCalls,
    extraCallsUnexplained,
  };

  const copies = (kind: string) => sent.deliveries.filter((delivery) => delivery.kind === kind).length;
  const maxKeys = Math.max(0, ...[...keysPerEvent.values()].map((keys) => keys.size));
  const lines = [
    `fault report: ${input.fault}, ${input.mode} mode (seed ${sent.seed}, ${(sent.elapsedMs / 1000).toFixed(1)} s)`,
    `events sent: ${report.eventsSent}`,
    `deliveries: ${report.deliveries} (duplicates: ${report.duplicates}, ` +
      `${Math.round((100 * report.duplicates) / Math.max(1, report.deliveries))}%: ` +
      `${copies('concurrent-copy')} concurrent copies, ${copies('resend')} re-sends of answered events)`,
    `sends (with retries): ${report.sends}`,
    `answers by status: ${Object.entries(answers)
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([status, n]) => `${status}=${n}`)
      .join(', ')}`,
    `unexpected answers (not 2xx, not 503/409 with Retry-After): ${report.unexpectedAnswers.length}`,
    `deliveries never answered 2xx within the bound: ${report.unsettledDeliveries}`,
    `events lost: ${report.eventsLost.length}`,
    input.mode === 'transaction'
      ? `database effects doubled: ${report.effectsDoubled.length}`
      : `database effects doubled: ${report.effectsDoubled.length} (orders rows; external mode writes none, its effect is the downstream call)`,
    `claims left unfinished after a 2xx: ${report.unfinishedClaims.length}`,
    input.mode === 'transaction'
      ? 'extra downstream calls: n/a (transaction mode calls no downstream)'
      : `extra downstream calls: ${extraDownstreamCalls} (after a SIGKILLed caller: ` +
        `${extraDownstreamCalls - extraCallsUnexplained}, otherwise: ${extraCallsUnexplained}); ` +
        `Idempotency-Keys per event: at most ${maxKeys}`,
  ];
  console.log(lines.join('\n'));
  return report;
}

/**
 * The fault suite's verdict: every event acknowledged and applied once, no answer other than 2xx
 * or "retry later", no claim left to expire; and no extra downstream call, unless `killed` says
 * processes died, when only calls repeated after a dead caller's are allowed.
 */
export function expectExactlyOnce(report: FaultReport, options: { killed?: boolean } = {}): void {
  const first = <T>(items: T[]) => items.slice(0, 5);
  expect({
    unexpectedAnswers: first(report.unexpectedAnswers),
    unsettledDeliveries: report.unsettledDeliveries,
    eventsLost: first(report.eventsLost),
    effectsDoubled: first(report.effectsDoubled),
    unfinishedClaims: first(report.unfinishedClaims),
    extraDownstreamCalls: options.killed ? report.extraCallsUnexplained : report.extraDownstreamCalls,
  }).toEqual({
    unexpectedAnswers: [],
    unsettledDeliveries: 0,
    eventsLost: [],
    effectsDoubled: [],
    unfinishedClaims: [],
    extraDownstreamCalls: 0,
  });
  expect(report.eventsSent).toBeGreaterThan(0);
}
