import {
  INNER_SCOPES,
  type ModelMode,
  type ModelPoint,
  type NestedVariant,
} from '../fixtures/model-webhooks.fixture.js';
import type { Answer, EventEffects } from './model-system.js';

/** The handlers an event can be for (the model app's routes). */
export const ROUTES = ['tx', 'ext', 'switch', 'nested', 'req'] as const;
export type Route = (typeof ROUTES)[number];

/** Events per route in one run: few, so that commands meet the same event again. */
export const EVENTS_PER_ROUTE = 3;

/** The nested handler's inner claim, by event index: each variant has its own events. */
const VARIANTS: readonly NestedVariant[] = ['outer-manager', 'inner-manager', 'method'];

/** An event as commands name it: a route and an index, made an id by the run's prefix. */
export interface EventRef {
  route: Route;
  index: number;
}

/** The claim scope of each route (the handlers' default `Class.method` scopes). */
const SCOPES: Record<Route, string> = {
  tx: 'ModelController.tx',
  ext: 'ModelController.ext',
  switch: 'ModelSwitchController.handle',
  nested: 'ModelController.nested',
  req: 'ModelController.req',
};

/** The model_effects rows a database-effect event ends with, one of each. */
function effectKinds(event: EventRef): readonly string[] {
  if (event.route === 'tx' || event.route === 'req') return [event.route];
  return ['outer', 'inner'];
}

/** The route's name as commands print it: `tx#0`, `nested#2(method)`. */
export function eventName(event: EventRef): string {
  const variant = event.route === 'nested' ? `(${variantOf(event)})` : '';
  return `${event.route}#${event.index}${variant}`;
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

  constructor(readonly prefix: string) {}

  /** The event's id in this run. */
  id(event: EventRef): string {
    return `${this.prefix}${event.route}${event.index}`;
  }

  scope(event: EventRef): string {
    return SCOPES[event.route];
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
        story: [],
      };
      this.events.set(id, state);
    }
    return state;
  }

  /** Records a step of the run, and of the event's story when it concerns one. */
  note(step: string, event?: EventRef): void {
    this.steps.push(step);
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

  /**
   * What is missing from a done event's effect, or undefined when it is all there (at least once;
   * the final check counts exactly).
   */
  private missingEffect(event: EventRef, effects: EventEffects | undefined): string | undefined {
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
   * The final comparison, after every touched event was redelivered to a 2xx: each one's effect
   * exactly once and its claim(s) done; nothing for events never delivered.
   */
  compare(effects: Map<string, EventEffects>, claims: Map<string, string>): void {
    for (const [id, effect] of effects) {
      const state = this.events.get(id);
      if (!state?.touched)
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
      for (const scope of this.claimScopes(event)) {
        const status = claims.get(`${scope} ${state.id}`);
        if (status !== 'done')
          this.broken(event, `ends with its ${scope} claim ${status ?? 'missing'}, not done`);
      }
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
      `event ${eventName(event)} (id ${state.id}, scope ${this.scope(event)}) ${what}.\n` +
        `What happened to it:\n${story}\n` +
        `Whole run:\n${this.steps.map((step) => `  - ${step}`).join('\n')}`,
    );
  }
}

/** `200 processed`, `200 replayed`, `409 (Retry-After 1)`, `no answer (socket hang up)`. */
export function describeAnswer(answer: Answer): string {
  if (answer.status === 0) return `no answer (${answer.error})`;
  if (answer.status === 200 || answer.status === 201)
    return `${answer.status} ${answer.replayed ? 'replayed' : 'processed'}`;
  const retry = answer.retryAfter === undefined ? '' : ` (Retry-After ${answer.retryAfter})`;
  const message = (answer.body as { message?: unknown } | undefined)?.message;
  return `${answer.status}${retry}${typeof message === 'string' ? `: ${message}` : ''}`;
}

function describeRows(rows: Record<string, number>): string {
  const entries = Object.entries(rows);
  if (entries.length === 0) return 'no effect rows';
  return entries.map(([kind, count]) => `${count} '${kind}'`).join(', ');
}
