import {
  INNER_SCOPES,
  readBody,
  type ModelJob,
  type ModelMode,
  type ModelPoint,
  type NestedVariant,
  type OwnedAnswer,
} from '../fixtures/model-webhooks.fixture.js';
import type { Answer, EventEffects, Observed } from './model-system.js';

/** The handlers an event can be for (the model app's routes). */
export const ROUTES = ['tx', 'ext', 'switch', 'nested', 'req', 'hoA', 'hoB', 'reqo', 'ord', 'htx'] as const;
export type Route = (typeof ROUTES)[number];

/** The request-mode route's two callers, who send each other's keys. */
export const OWNERS = ['alice', 'bob'] as const;
export type Owner = (typeof OWNERS)[number];

/** The routes whose deliveries enqueue jobs (the two handoff scopes, and the handler-tx one). */
export const JOB_ROUTES: readonly Route[] = ['hoA', 'hoB', 'htx'];

/** Jobs a handoff event enqueues, by index: two on one queue, none, three. */
const JOBS_PER_INDEX = [2, 0, 3];

/** The request-mode route's bodies, by index: JSON, text and bytes. */
export type BodyKind = 'json' | 'text' | 'binary';
const BODY_KINDS: readonly BodyKind[] = ['json', 'text', 'binary'];

/** A request-mode body as sent: its Content-Type and bytes. */
export interface RequestBody {
  contentType: string;
  bytes: Buffer;
  kind: BodyKind;
}

/** Events per route in one run: few, so that commands meet the same event again. */
export const EVENTS_PER_ROUTE = 3;

/** The nested handler's inner claim, by event index: each variant has its own events. */
const VARIANTS: readonly NestedVariant[] = ['outer-manager', 'inner-manager', 'method'];

/** An event as commands name it: a route and an index, made an id by the run's prefix. */
export interface EventRef {
  route: Route;
  index: number;
  /** The request-mode route's caller (`reqo` only): part of the event, as the claim is theirs. */
  owner?: Owner;
}

/** The claim scope of each route (the handlers' default `Class.method` scopes). */
const SCOPES: Record<Route, string> = {
  tx: 'ModelController.tx',
  ext: 'ModelController.ext',
  switch: 'ModelSwitchController.handle',
  nested: 'ModelController.nested',
  req: 'ModelController.req',
  hoA: 'ModelController.hoA',
  hoB: 'ModelController.hoB',
  reqo: 'ModelController.reqo',
  ord: 'ModelController.ord',
  htx: 'ModelController.htx',
};

/**
 * The model_effects rows a database-effect event ends with, one of each (an ordered event's row
 * only when it was applied, not stale: see compare()).
 */
function effectKinds(event: EventRef): readonly string[] {
  switch (event.route) {
    case 'nested':
      return ['outer', 'inner'];
    case 'htx':
      return ['htx', 'htx-inner'];
    default:
      return [event.route];
  }
}

/** Rows no event may end with: the work of a transaction the handler rolled back itself. */
const ROLLED_BACK_KINDS: Partial<Record<Route, string>> = { htx: 'htx-rolled' };

/** The route's name as commands print it: `tx#0`, `nested#2(method)`, `reqo#1@bob`. */
export function eventName(event: EventRef): string {
  const variant = event.route === 'nested' ? `(${variantOf(event)})` : '';
  const owner = event.route === 'reqo' ? `@${event.owner ?? OWNERS[0]}` : '';
  return `${event.route}#${event.index}${variant}${owner}`;
}

/** The request-mode body of event `index` under `key`: the same bytes for both callers. */
export function requestBody(index: number, key: string): RequestBody {
  const kind = BODY_KINDS[index % BODY_KINDS.length];
  if (kind === 'json')
    return {
      kind,
      contentType: 'application/json',
      bytes: Buffer.from(JSON.stringify({ refund: key, amount: 10 })),
    };
  if (kind === 'text')
    return { kind, contentType: 'text/plain', bytes: Buffer.from(`refund ${key} amount 11`) };
  return {
    kind,
    contentType: 'application/octet-stream',
    bytes: Buffer.from([0, 255, 1, index, ...Buffer.from(key)]),
  };
}

/** What the request-mode handler says it read of `body` (readBody of the parsed body). */
function expectedRead(body: RequestBody): string {
  if (body.kind === 'json') return readBody(JSON.parse(body.bytes.toString()));
  if (body.kind === 'text') return readBody(body.bytes.toString());
  return readBody(body.bytes);
}

/** A job, or a callback, some event's committed work must have once, or its rolled-back work never. */
interface Derived {
  /** Its effect id: model_effects.event_id (kind 'job') or a downstream call's eventId. */
  id: string;
  what: 'job' | 'callback';
  /** 1: it must run (fire) exactly once; 0: never. */
  expected: 0 | 1;
  event: EventRef;
  why: string;
}

/** The nested handler's inner claim for `event` (a nested event keeps its variant for good). */
export function variantOf(event: EventRef): NestedVariant {
  return VARIANTS[event.index % VARIANTS.length];
}

/** A broken promise: the property's failure, with what happened to the event. */
export class PromiseBroken extends Error {
  override name = 'PromiseBroken';
}

/** What the model knows of one event: what was done to it and how it was answered. */
interface EventState {
  ref: EventRef;
  id: string;
  /** Any delivery was sent: after the run it must end done, with its effect once. */
  touched: boolean;
  /** Answers 200 without the replayed header: the handler ran and its work was committed. */
  processedAnswers: number;
  /**
   * Downstream calls whose delivery's work was lost after the call: SIGKILLed between its call
   * and its completion, or a transaction-mode handler (the switchable scope's) whose transaction
   * died with the database after it called. No claim can take back a call already made, so the
   * promise lets such a call happen again; this is what external mode is for.
   */
  repeatableCalls: number;
  /** A SIGKILLed external-mode holder's lease, not yet expired or taken over. */
  deadLease: boolean;
  /** Jobs of this event cut by a SIGKILL of their worker (they run again). */
  jobsKilled: number;
  /** What happened to it, in order, for the failure message. */
  story: string[];
}

/**
 * The reference model: the library's promise, stated per event. Every event delivered ends with
 * its effect exactly once (one row per effect kind; one downstream call, except a call whose
 * delivery was killed, or lost its transaction, before it could record it); every 2xx answer comes after the effect is there;
 * no delivery is processed twice; the only other answers are "retry later" (409 or 503 with
 * Retry-After) and the handler's own failure when the delivery asked for one.
 */
export class ReferenceModel {
  /**
   * The mode the switchable scope is deployed with: a run starts with `external: true` on it,
   * as before the deploy that removes it.
   */
  switchMode: ModelMode = 'external';
  private readonly events = new Map<string, EventState>();
  /** Everything the run did, in order, for the failure message. */
  readonly steps: string[] = [];
  private readonly began = performance.now();

  /**
   * `prefix` starts every id of the run; `jobKeys` gives the last job of a handoff event its own
   * key (enqueue()'s `key`), shared by the two handoff scopes' events of that index.
   */
  constructor(
    readonly prefix: string,
    readonly jobKeys = true,
  ) {}

  /** The event's id in this run: what its effects are recorded under. */
  id(event: EventRef): string {
    if (event.route === 'reqo') return `${this.key(event)}@${event.owner ?? OWNERS[0]}`;
    return `${this.prefix}${event.route}${event.index}`;
  }

  /**
   * The key its deliveries carry: the handoff scopes' events share theirs (as two handlers of one
   * sender's events do), and the two callers of the request-mode route send each other's keys.
   */
  key(event: EventRef): string {
    if (event.route === 'hoA' || event.route === 'hoB') return `${this.prefix}ho${event.index}`;
    if (event.route === 'reqo') return `${this.prefix}rk${event.index}`;
    return this.id(event);
  }

  /** The key of its claim row: a request-mode key is its caller's (`<owner>:<key>`). */
  claimKey(event: EventRef): string {
    if (event.route === 'reqo') return `${event.owner ?? OWNERS[0]}:${this.key(event)}`;
    return this.key(event);
  }

  scope(event: EventRef): string {
    return SCOPES[event.route];
  }

  /** The jobs a delivery of `event` enqueues (the same on every delivery). */
  jobs(event: EventRef): ModelJob[] {
    if (event.route !== 'hoA' && event.route !== 'hoB') return [];
    const id = this.id(event);
    const count = JOBS_PER_INDEX[event.index % JOBS_PER_INDEX.length];
    return Array.from({ length: count }, (_, n) => {
      if (n === 2 && this.jobKeys) {
        const key = `${this.prefix}ship${event.index}`;
        return { job: key, key };
      }
      return { job: `${id}.j${n}` };
    });
  }

  /** The ordered route's entity (one for the run) and each event's version. */
  entity(): string {
    return `${this.prefix}entity`;
  }

  version(event: EventRef): number {
    return event.index + 1;
  }

  /** The callbacks the drain waits for: each handler-tx event's last one (its others come before it). */
  callbacksDue(): string[] {
    return this.touched()
      .filter((event) => event.route === 'htx')
      .map((event) => `${this.id(event)}.cb-kept`);
  }

  /** A job of `event` was cut by a SIGKILL of the process running it. */
  jobKilled(event: EventRef): void {
    this.state(event).jobsKilled++;
  }

  /** Whether the event's effect is a downstream call (else database rows). */
  isExternalEffect(event: EventRef): boolean {
    return event.route === 'ext' || event.route === 'switch';
  }

  state(event: EventRef): EventState {
    const id = this.id(event);
    let state = this.events.get(id);
    if (!state) {
      state = {
        ref: event,
        id,
        touched: false,
        processedAnswers: 0,
        repeatableCalls: 0,
        deadLease: false,
        jobsKilled: 0,
        story: [],
      };
      this.events.set(id, state);
    }
    return state;
  }

  /** Records a step of the run (with the time into it), and of the event's story when it concerns one. */
  note(step: string, event?: EventRef): void {
    this.steps.push(`${step} [${Math.round(performance.now() - this.began)} ms]`);
    if (event) this.state(event).story.push(step);
  }

  /** A delivery was sent for `event`. */
  touch(event: EventRef): void {
    this.state(event).touched = true;
  }

  /** Events some delivery was sent for. */
  touched(): EventRef[] {
    return [...this.events.values()].filter((state) => state.touched).map((state) => state.ref);
  }

  /** Events whose external-mode holder was killed and whose lease has not been expired since. */
  deadLeases(): EventRef[] {
    return [...this.events.values()].filter((state) => state.deadLease).map((state) => state.ref);
  }

  /** A delivery of `event` parked at `point` was SIGKILLed. */
  killed(event: EventRef, point: ModelPoint, mode: ModelMode): void {
    const state = this.state(event);
    if (this.isExternalEffect(event) && point === 'after-effect') state.repeatableCalls++;
    if (mode === 'external') state.deadLease = true;
  }

  /**
   * A transaction-mode delivery of `event` that made its downstream call lost its transaction
   * with the database connection (answered 503): the redelivery calls again.
   */
  transactionLostAfterCall(event: EventRef): void {
    if (this.isExternalEffect(event)) this.state(event).repeatableCalls++;
  }

  /** The dead holder's lease of `event` ran out. */
  leaseExpired(event: EventRef): void {
    this.state(event).deadLease = false;
  }

  /**
   * Judges one answer to a delivery of `event`. `effects` reads the event's effects now (after the
   * answer arrived, so a 2xx must find them); `failed` says whether the delivery asked its handler
   * to throw. Throws PromiseBroken when the promise does not hold.
   */
  async judge(
    event: EventRef,
    answer: Answer,
    how: { failed?: boolean; during: string; mode: ModelMode },
    effects: () => Promise<EventEffects | undefined>,
  ): Promise<void> {
    const state = this.state(event);
    const said = describeAnswer(answer);
    this.note(`${eventName(event)} ${how.during} (${how.mode} mode): ${said}`, event);
    if (answer.status === 200 || answer.status === 201) {
      if (!answer.replayed) state.processedAnswers++;
      // Done now (or the promise is broken below): no dead holder is left to wait for.
      state.deadLease = false;
      if (state.processedAnswers > 1) this.broken(event, `was processed a second time (${said})`);
      if (event.route === 'reqo') this.checkOwnAnswer(event, answer, said);
      if (answer.stale) {
        if (event.route !== 'ord') this.broken(event, `was answered ${said} stale, and it is not ordered`);
        return;
      }
      const missing = this.missingEffect(event, await effects());
      if (missing) this.broken(event, `was answered ${said}, yet ${missing}`);
      return;
    }
    if (answer.status === 409 || answer.status === 503) {
      if (!/^[1-9][0-9]*$/.test(answer.retryAfter ?? ''))
        this.broken(event, `was answered ${answer.status} without a Retry-After of whole seconds`);
      return;
    }
    if (answer.status >= 500 && how.failed) return;
    this.broken(event, `was answered ${said}, which is neither a 2xx nor "retry later"`);
  }

  /** A request-mode answer must be the caller's own: its owner, its key, the body it sent. */
  private checkOwnAnswer(event: EventRef, answer: Answer, said: string): void {
    const body = answer.body as Partial<OwnedAnswer> | undefined;
    const expected: OwnedAnswer = {
      owner: event.owner ?? OWNERS[0],
      key: this.key(event),
      read: expectedRead(requestBody(event.index, this.key(event))),
    };
    const got = JSON.stringify({ owner: body?.owner, key: body?.key, read: body?.read });
    if (got !== JSON.stringify(expected))
      this.broken(
        event,
        `was answered ${said} with a response that is not its caller's own: ${got}, where it sent ${JSON.stringify(expected)}`,
      );
  }

  /**
   * What is missing from a done event's effect, or undefined when it is all there (at least once;
   * the final check counts exactly).
   */
  private missingEffect(event: EventRef, effects: EventEffects | undefined): string | undefined {
    // An ordered event's effect is applied or stale: compare() checks which version stands.
    if (event.route === 'ord') return undefined;
    const rows = effects?.rows ?? {};
    const calls = effects?.calls.length ?? 0;
    if (this.isExternalEffect(event)) {
      return calls === 0 ? 'its effect is not there: the downstream received no call for it' : undefined;
    }
    const kinds = effectKinds(event);
    const absent = kinds.filter((kind) => !rows[kind]);
    if (absent.length === 0) return undefined;
    return `its effect is not there: no ${absent.map((kind) => `'${kind}'`).join(' and no ')} row (${describeRows(rows)})`;
  }

  /**
   * The jobs and callbacks the touched events' work must have had, once each, and those of work
   * their handler rolled back itself, never.
   */
  private derived(): Derived[] {
    const derived = new Map<string, Derived>();
    for (const event of this.touched()) {
      const name = eventName(event);
      for (const job of this.jobs(event))
        derived.set(job.job, {
          id: job.job,
          what: 'job',
          expected: 1,
          event,
          why:
            job.key === undefined ? `enqueued by ${name}` : `enqueued by ${name} with its own key ${job.key}`,
        });
      if (event.route !== 'htx') continue;
      const id = this.id(event);
      const add = (suffix: string, what: Derived['what'], expected: 0 | 1, where: string) =>
        derived.set(`${id}.${suffix}`, {
          id: `${id}.${suffix}`,
          what,
          expected,
          event,
          why: `${what === 'job' ? 'enqueued' : 'registered'} by ${name} ${where}`,
        });
      add('inner', 'job', 1, 'in a transaction of its own that committed');
      add('rolled', 'job', 0, 'in a transaction of its own that rolled back');
      add('cb-inner', 'callback', 1, 'in a transaction of its own that committed');
      add('cb-kept', 'callback', 1, 'in the delivery itself');
      add('cb-rolled', 'callback', 0, 'in a transaction of its own that rolled back');
    }
    return [...derived.values()];
  }

  /**
   * The final comparison, after every touched event was redelivered to a 2xx and every job has
   * settled: each event's effect exactly once and its claim(s) done; each job a committed delivery
   * enqueued ran exactly once (a run a SIGKILL cut rolled back), and none of rolled-back work ran;
   * each callback fired if and only if its work committed; per entity the newest version won;
   * nothing for events never delivered.
   */
  compare(observed: Observed): void {
    const { effects, claims } = observed;
    const derived = new Map(this.derived().map((entry) => [entry.id, entry]));
    for (const [id, effect] of effects) {
      const state = this.events.get(id);
      if (!state?.touched && !derived.has(id))
        throw new PromiseBroken(
          `effects for ${id}, which was never delivered: ${describeRows(effect.rows)}, ${effect.calls.length} calls`,
        );
    }
    for (const event of this.touched()) {
      const state = this.state(event);
      const effect = effects.get(state.id) ?? { rows: {}, calls: [] };
      if (this.isExternalEffect(event)) {
        const calls = effect.calls.length;
        if (calls === 0) this.broken(event, 'ends with no downstream call: its effect was lost');
        if (calls - state.repeatableCalls > 1)
          this.broken(
            event,
            `ends with ${calls} downstream calls (from pids ${effect.calls.join(', ')}), ` +
              `of which only ${state.repeatableCalls} came from deliveries whose work was lost after the call`,
          );
      } else if (event.route === 'ord') {
        const count = effect.rows.ord ?? 0;
        if (count > 1) this.broken(event, `was applied ${count} times`);
      } else {
        for (const kind of effectKinds(event)) {
          const count = effect.rows[kind] ?? 0;
          if (count !== 1)
            this.broken(
              event,
              `ends with ${count} '${kind}' rows, not exactly one (${describeRows(effect.rows)})` +
                (count === 0 ? ': that effect was lost' : ': that effect was doubled'),
            );
        }
      }
      const rolled = ROLLED_BACK_KINDS[event.route];
      if (rolled && effect.rows[rolled])
        this.broken(
          event,
          `ends with ${effect.rows[rolled]} '${rolled}' rows, written in a transaction that rolled back`,
        );
      for (const scope of this.claimScopes(event)) {
        const status = claims.get(`${scope} ${this.claimKey(event)}`);
        if (status !== 'done')
          this.broken(event, `ends with its ${scope} claim ${status ?? 'missing'}, not done`);
      }
    }
    for (const entry of derived.values()) {
      const effect = effects.get(entry.id);
      const count = entry.what === 'job' ? (effect?.rows.job ?? 0) : (effect?.calls.length ?? 0);
      if (count === entry.expected) continue;
      const jobStates = observed.jobs.get(entry.id);
      const queued = entry.what === 'job' ? `; its pg-boss job(s): ${jobStates?.join(', ') || 'none'}` : '';
      const verb = entry.what === 'job' ? 'ran' : 'fired';
      const times = count === 1 ? 'once' : `${count} times`;
      const what =
        entry.expected === 0
          ? `${verb} ${times}, though the work it belongs to rolled back`
          : count === 0
            ? entry.what === 'job'
              ? 'never ran'
              : 'never fired, though its work committed'
            : `${verb} ${times}, not once`;
      this.broken(entry.event, `has its ${entry.what} ${entry.id} (${entry.why}), which ${what}${queued}`);
    }
    this.compareOrdering(observed);
  }

  /** Per entity, the newest version delivered is the one that stands, and none applied out of order. */
  private compareOrdering(observed: Observed): void {
    const ordered = this.touched().filter((event) => event.route === 'ord');
    if (ordered.length === 0) return;
    const newest = ordered.reduce((a, b) => (this.version(a) >= this.version(b) ? a : b));
    const stands = observed.entities.get(this.entity());
    if (stands !== this.version(newest))
      this.broken(
        newest,
        `is the newest version (${this.version(newest)}) of ${this.entity()}, which ends at version ${stands ?? 'none'}`,
      );
    const byId = new Map(ordered.map((event) => [this.id(event), event]));
    let last: EventRef | undefined;
    for (const id of observed.applied) {
      const event = byId.get(id);
      if (!event) continue;
      if (last && this.version(event) <= this.version(last))
        this.broken(
          event,
          `(version ${this.version(event)}) was applied after ${eventName(last)} (version ${this.version(last)})`,
        );
      last = event;
    }
  }

  /** The claim scopes a done event must have a done row in. */
  private claimScopes(event: EventRef): string[] {
    if (event.route !== 'nested') return [this.scope(event)];
    return [this.scope(event), INNER_SCOPES[variantOf(event)]];
  }

  /** Throws the broken promise, with the event's story and the whole run's steps. */
  broken(event: EventRef, what: string): never {
    const state = this.state(event);
    const story = state.story.map((step, index) => `  ${index + 1}. ${step}`).join('\n');
    throw new PromiseBroken(
      `event ${eventName(event)} (id ${state.id}, key ${this.key(event)}, scope ${this.scope(event)}) ${what}.\n` +
        `What happened to it:\n${story}\n` +
        `Whole run:\n${this.steps.map((step) => `  - ${step}`).join('\n')}`,
    );
  }
}

/** `200 processed`, `200 replayed`, `409 (Retry-After 1)`, `no answer (socket hang up)`. */
export function describeAnswer(answer: Answer): string {
  if (answer.status === 0) return `no answer (${answer.error})`;
  if (answer.status === 200 || answer.status === 201)
    return `${answer.status} ${answer.replayed ? 'replayed' : answer.stale ? 'stale' : 'processed'}`;
  const retry = answer.retryAfter === undefined ? '' : ` (Retry-After ${answer.retryAfter})`;
  const message = (answer.body as { message?: unknown } | undefined)?.message;
  // A stored answer other than a 2xx (a handler's 5xx that was kept) says it was replayed.
  const replayed = answer.replayed ? ' replayed' : '';
  return `${answer.status}${replayed}${retry}${typeof message === 'string' ? `: ${message}` : ''}`;
}

function describeRows(rows: Record<string, number>): string {
  const entries = Object.entries(rows);
  if (entries.length === 0) return 'no effect rows';
  return entries.map(([kind, count]) => `${count} '${kind}'`).join(', ');
}
