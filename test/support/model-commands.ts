import fc from 'fast-check';
import type { ModelDelivery, ModelMode, ModelPoint } from '../fixtures/model-webhooks.fixture.js';
import {
  EVENTS_PER_ROUTE,
  OWNERS,
  ROUTES,
  eventName,
  requestBody,
  variantOf,
  type EventRef,
  type ReferenceModel,
  type Route,
} from './model-reference.js';
import { REPLICAS, type Answer, type ModelApp, type ModelSystem, type Parking } from './model-system.js';

/** One step of a run: fast-check's command over the reference model and the real system. */
export type ModelCommand = fc.AsyncCommand<ReferenceModel, ModelSystem>;

/** Redeliveries per event when the run ends, each after a short pause on a "retry later". */
const DRAIN_TRIES = 60;
/** The pause between redeliveries of the drain: a sender's backoff, compressed. */
const DRAIN_PAUSE_MS = 150;

/** The scenarios MODEL_WITHOUT can leave out (for triage; see the spec). */
export const SCENARIOS = [
  'mode-switch',
  'overlap',
  'nested',
  'kill',
  'db-restart',
  'expire',
  'concurrent',
  // The handoff: both handoff scopes (and their jobs), and within it the jobs with keys of their
  // own and the worker SIGKILLed mid-job.
  'handoff',
  'job-key',
  'job-kill',
  // Request mode with two callers and three body types, and within it the handler's own 5xx.
  'request',
  'handler-5xx',
  'ordering',
  // The handler's own transactions around afterCommit and enqueue.
  'handler-tx',
] as const;
export type Scenario = (typeof SCENARIOS)[number];

/** The mode `app` claims `event` in. */
function modeIn(app: ModelApp, event: EventRef): ModelMode {
  if (event.route === 'switch') return app.release.switchMode;
  return event.route === 'ext' ? 'external' : 'transaction';
}

function body(model: ReferenceModel, event: EventRef, extra: Partial<ModelDelivery> = {}): ModelDelivery {
  const delivery: ModelDelivery = { id: model.id(event), ...extra };
  switch (event.route) {
    case 'nested':
      return { ...delivery, variant: variantOf(event) };
    case 'hoA':
    case 'hoB':
      return { ...delivery, key: model.key(event), jobs: model.jobs(event) };
    case 'ord':
      return { ...delivery, entity: model.entity(), version: model.version(event) };
    case 'reqo': {
      const sent = requestBody(event.index, model.key(event));
      const request = {
        owner: event.owner ?? OWNERS[0],
        key: model.key(event),
        contentType: sent.contentType,
        base64: sent.bytes.toString('base64'),
      };
      return { ...delivery, request };
    }
    default:
      return delivery;
  }
}

const path = (event: EventRef) => `/${event.route}`;

/** Judges an answer against the model, reading the event's effects as they are now. */
function judge(
  model: ReferenceModel,
  system: ModelSystem,
  event: EventRef,
  answer: Answer,
  how: { failed?: boolean; during: string; mode: ModelMode },
): Promise<void> {
  return model.judge(event, answer, how, async () =>
    (await system.effects(model.id(event))).get(model.id(event)),
  );
}

/** Sends one delivery of `event` to `app` and judges its answer. */
async function deliver(
  model: ReferenceModel,
  system: ModelSystem,
  event: EventRef,
  app: ModelApp,
  during: string,
  extra: Partial<ModelDelivery> = {},
): Promise<Answer> {
  model.touch(event);
  const answer = await system.send(path(event), body(model, event, extra), app);
  await judge(model, system, event, answer, {
    failed: extra.fail,
    during: `${during} to pid ${app.pid}`,
    mode: modeIn(app, event),
  });
  return answer;
}

/** `@r0`, `@r1`: the replica a command starts on. */
const on = (slot: number) => `@r${slot}`;

/**
 * `copies` deliveries of one event, one after another, alternating replicas from `slot`: a
 * sender's retries and duplicates behind a load balancer.
 */
class Deliver implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly copies: number,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    for (let copy = 0; copy < this.copies; copy++) {
      const app = system.replica(this.slot + copy);
      await deliver(model, system, this.event, app, `delivered (copy ${copy + 1} of ${this.copies})`);
    }
  }
  toString = () => `deliver(${eventName(this.event)}, copies=${this.copies})${on(this.slot)}`;
}

/** One delivery whose handler throws at its failure point (see ModelDelivery.fail). */
class FailOnce implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const app = system.replica(this.slot);
    await deliver(model, system, this.event, app, 'delivered with a handler failure', { fail: true });
  }
  toString = () => `failNext(${eventName(this.event)})${on(this.slot)}`;
}

/**
 * `copies` deliveries of one event at once, racing for its claim, alternating replicas from
 * `slot`: in one process and across processes (on separate connections).
 */
class DeliverConcurrently implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly copies: number,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const apps = Array.from({ length: this.copies }, (_, copy) => system.replica(this.slot + copy));
    await Promise.all(
      apps.map((app, copy) =>
        deliver(
          model,
          system,
          this.event,
          app,
          `delivered concurrently (copy ${copy + 1} of ${this.copies})`,
        ),
      ),
    );
  }
  toString = () => `deliverConcurrently(${eventName(this.event)}, copies=${this.copies})${on(this.slot)}`;
}

/**
 * A delivery parked after its claim on replica `slot` while `copies` duplicates arrive on the
 * other replica and this one in turn; then it goes on.
 */
class DuplicatesWhileParked implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly copies: number,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const { event } = this;
    const app = system.replica(this.slot);
    const mode = modeIn(app, event);
    model.touch(event);
    const parking = await system.park(path(event), body(model, event), app);
    if (!parking.parked) {
      await judge(model, system, event, await parking.answer, {
        during: `delivered to pid ${app.pid}`,
        mode,
      });
      return;
    }
    model.note(
      `${eventName(event)} delivered to pid ${app.pid} and parked after its claim (${mode} mode)`,
      event,
    );
    try {
      for (let copy = 1; copy <= this.copies; copy++) {
        const duplicateTo = system.replica(this.slot + copy);
        await deliver(model, system, event, duplicateTo, `delivered while a copy is parked (copy ${copy})`);
      }
    } finally {
      parking.open();
    }
    await judge(model, system, event, await parking.answer, {
      during: `parked copy let go in pid ${app.pid}`,
      mode,
    });
  }
  toString = () => `duplicatesWhileParked(${eventName(this.event)}, copies=${this.copies})${on(this.slot)}`;
}

/** A delivery parked at `point` whose process is SIGKILLed there; the replica is started again. */
class KillDuringWork implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly point: ModelPoint,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const { event, point } = this;
    const app = system.replica(this.slot);
    const mode = modeIn(app, event);
    model.touch(event);
    const parking = await system.park(path(event), body(model, event, { park: point }), app);
    if (!parking.parked) {
      await judge(model, system, event, await parking.answer, {
        during: `delivered to pid ${app.pid}`,
        mode,
      });
      return;
    }
    await system.kill(app);
    const answer = await parking.answer;
    model.killed(event, point, mode);
    model.note(
      `${eventName(event)} delivered, parked ${point} (${mode} mode); its process ${app.pid} SIGKILLed`,
      event,
    );
    if (answer.status !== 0)
      model.broken(event, `was answered ${answer.status} by a process killed mid-work`);
    system.route(this.slot, await system.boot(app.release));
  }
  toString = () => `killDuringWork(${eventName(this.event)}, ${this.point})${on(this.slot)}`;
}

/** Gates of the jobs KillDuringJob parks, unique in the test. */
let jobGates = 0;

/**
 * A delivery whose first job parks on its first attempt, in whichever replica's worker takes it,
 * and that process SIGKILLed there (inside the worker's claim transaction); the replica is started
 * again, and pg-boss hands the job out again once it expires.
 */
class KillDuringJob implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const { event } = this;
    const gate = `${model.id(event)}#job${++jobGates}`;
    const answer = await deliver(
      model,
      system,
      event,
      system.replica(this.slot),
      'delivered, its first job to park',
      {
        jobGate: gate,
      },
    );
    // Only the delivery that commits enqueues: a replay, a 409 or a failure has no job.
    if (answer.status < 200 || answer.status >= 300 || answer.replayed) return;
    const runner = await system.enteredAnywhere(gate);
    if (!runner)
      model.broken(event, `was answered 200 processed, yet its first job never started (gate ${gate})`);
    const slot = system.slotOf(runner);
    await system.kill(runner);
    model.jobKilled(event);
    model.note(`${eventName(event)}: its first job parked in pid ${runner.pid}, SIGKILLed there`, event);
    system.route(slot, await system.boot(runner.release));
  }
  toString = () => `killDuringJob(${eventName(this.event)})${on(this.slot)}`;
}

/** A request-mode delivery whose handler writes its row and then answers `status` itself. */
class Answer5xx implements ModelCommand {
  constructor(
    readonly event: EventRef,
    readonly status: number,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const app = system.replica(this.slot);
    model.touch(this.event);
    const answer = await system.send(path(this.event), body(model, this.event, { status: this.status }), app);
    await judge(model, system, this.event, answer, {
      failed: true,
      during: `delivered asking its handler to answer ${this.status} to pid ${app.pid}`,
      mode: modeIn(app, this.event),
    });
  }
  toString = () => `answer5xx(${eventName(this.event)}, ${this.status})${on(this.slot)}`;
}

/** The lease of an event whose external-mode holder was killed runs out (lib/testing). */
class ExpireLease implements ModelCommand {
  constructor(readonly event: EventRef) {}
  check = (model: Readonly<ReferenceModel>) =>
    (model as ReferenceModel).deadLeases().some((dead) => eventName(dead) === eventName(this.event));
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const expired = await system.expireLease(model.scope(this.event), model.id(this.event));
    model.leaseExpired(this.event);
    model.note(
      `${eventName(this.event)}: the killed holder's lease ${expired ? 'expired' : 'was no longer in progress'}`,
      this.event,
    );
  }
  toString = () => `expireLease(${eventName(this.event)})`;
}

/**
 * A rolling deploy that flips the switchable handler's mode on its unchanged scope: each replica
 * in turn is replaced by one of the new release (booted beside it, then the old one stops). With
 * `overlap`, a delivery of that switch event is parked in the first old replica while `copies`
 * duplicates reach its replacement: both releases hold the scope at once.
 */
class SwitchMode implements ModelCommand {
  constructor(
    readonly overlap: number | undefined,
    readonly copies: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const from = system.replica(0).release;
    const mode: ModelMode = from.switchMode === 'external' ? 'transaction' : 'external';
    const to = { ...from, switchMode: mode };
    const event: EventRef | undefined =
      this.overlap === undefined ? undefined : { route: 'switch', index: this.overlap };
    model.note(`rolling deploy: ModelSwitchController.handle from ${from.switchMode} to ${mode} mode`);
    for (let slot = 0; slot < REPLICAS; slot++) {
      const old = system.replica(slot);
      const parking =
        event && slot === 0
          ? (model.touch(event), await system.park(path(event), body(model, event), old))
          : undefined;
      if (event && parking?.parked)
        model.note(
          `${eventName(event)} delivered to old pid ${old.pid} and parked after its claim (${from.switchMode} mode)`,
          event,
        );
      const next = await system.boot(to);
      system.route(slot, next);
      model.note(`replica ${slot}: pid ${next.pid} (${mode} mode) replaces pid ${old.pid}`);
      if (event && parking) await this.overlapping(model, system, event, parking, old, next);
      await system.stop(old);
    }
    model.switchMode = mode;
  }

  /** Duplicates to the new release while the old one's handler holds the claim. */
  private async overlapping(
    model: ReferenceModel,
    system: ModelSystem,
    event: EventRef,
    parking: Parking,
    old: ModelApp,
    next: ModelApp,
  ): Promise<void> {
    if (!parking.parked) {
      await judge(model, system, event, await parking.answer, {
        during: `delivered to old pid ${old.pid}`,
        mode: old.release.switchMode,
      });
      return;
    }
    // A claim that waits on the old release's row lock is let through by opening the gate once
    // every duplicate waits on it (or was answered).
    const answers = Array.from({ length: this.copies }, (_, copy) =>
      system.send(path(event), body(model, event), next).then((answer) =>
        judge(model, system, event, answer, {
          during: `delivered to new pid ${next.pid} while the old one's copy is parked (copy ${copy + 1})`,
          mode: next.release.switchMode,
        }),
      ),
    );
    try {
      await system.lockedOrSettled(this.copies, Promise.all(answers));
    } finally {
      parking.open();
    }
    await Promise.all(answers);
    await judge(model, system, event, await parking.answer, {
      during: `parked copy let go in old pid ${old.pid}`,
      mode: old.release.switchMode,
    });
  }

  toString = () =>
    `switchMode(${this.overlap === undefined ? 'no overlap' : `overlap switch#${this.overlap}, copies=${this.copies}`})`;
}

/**
 * PostgreSQL restarted (a fast shutdown, then the same server back): a delivery sent while it is
 * down, and optionally one parked in its handler across the restart.
 */
class RestartDatabase implements ModelCommand {
  constructor(
    readonly parked: EventRef | undefined,
    readonly probe: EventRef,
    readonly slot: number,
  ) {}
  check = () => true;
  async run(model: ReferenceModel, system: ModelSystem): Promise<void> {
    const app = system.replica(this.slot);
    const { parked, probe } = this;
    // External effects park before their call, so that in external mode the call is made with the
    // database back and its completion lands.
    const point: ModelPoint = parked && model.isExternalEffect(parked) ? 'before-effect' : 'after-effect';
    if (parked) model.touch(parked);
    const parking = parked
      ? await system.park(path(parked), body(model, parked, { park: point }), app)
      : undefined;
    if (parked && parking?.parked)
      model.note(
        `${eventName(parked)} delivered to pid ${app.pid}, parked ${point} (${modeIn(app, parked)} mode)`,
        parked,
      );
    await system.haltDatabase();
    model.note('database halted');
    model.touch(probe);
    const probeAnswer = await system.send(path(probe), body(model, probe), app);
    await system.resumeDatabase();
    model.note('database back');
    parking?.open();
    // Judged with the server back: judging reads the effects.
    await judge(model, system, probe, probeAnswer, {
      during: `delivered to pid ${app.pid} while the database was down`,
      mode: modeIn(app, probe),
    });
    if (parked && parking) {
      const answer = await parking.answer;
      const mode = modeIn(app, parked);
      // The switchable handler in transaction mode, let go, calls in a transaction the restart
      // has ended: the call stands, the claim does not, and the redelivery calls again.
      if (parking.parked && mode === 'transaction' && answer.status === 503)
        model.transactionLostAfterCall(parked);
      await judge(model, system, parked, answer, {
        during: parking.parked
          ? `parked across the restart in pid ${app.pid}, let go`
          : `delivered to pid ${app.pid}`,
        mode,
      });
    }
  }
  toString = () =>
    `restartDatabase(${this.parked ? `parked ${eventName(this.parked)}, ` : ''}probe ${eventName(this.probe)})${on(this.slot)}`;
}

/**
 * After the commands: every event delivered is redelivered until it gets a 2xx (bounded), the
 * killed holders' leases having run out first, as they would with time.
 */
export async function drain(model: ReferenceModel, system: ModelSystem): Promise<void> {
  for (const event of model.deadLeases()) await new ExpireLease(event).run(model, system);
  await Promise.all(
    model.touched().map(async (event) => {
      for (let attempt = 1; ; attempt++) {
        const app = system.replica(attempt);
        const answer = await deliver(model, system, event, app, `redelivered at the end (try ${attempt})`);
        if (answer.status >= 200 && answer.status < 300) return;
        if (attempt >= DRAIN_TRIES)
          model.broken(event, `was never acknowledged: ${DRAIN_TRIES} redeliveries, none answered 2xx`);
        await new Promise((resume) => setTimeout(resume, DRAIN_PAUSE_MS));
      }
    }),
  );
}

/** The command arbitraries, without the scenarios `without` names. */
export function modelCommands(without: ReadonlySet<Scenario>): fc.Arbitrary<ModelCommand>[] {
  const routeScenario: Partial<Record<Route, Scenario>> = {
    nested: 'nested',
    hoA: 'handoff',
    hoB: 'handoff',
    reqo: 'request',
    ord: 'ordering',
    htx: 'handler-tx',
  };
  const routes = ROUTES.filter((route) => {
    const scenario = routeScenario[route];
    return scenario === undefined || !without.has(scenario);
  });
  const eventOf = (among: readonly Route[], indexes?: readonly number[]) =>
    fc
      .tuple(
        fc.constantFrom(...among),
        indexes ? fc.constantFrom(...indexes) : fc.nat({ max: EVENTS_PER_ROUTE - 1 }),
        fc.constantFrom(...OWNERS),
      )
      .map(([route, index, owner]): EventRef =>
        route === 'reqo' ? { route, index, owner } : { route, index },
      );
  const event = eventOf(routes);
  // Events with a job: the handoff scopes' of indexes 0 and 2 (index 1 enqueues none), any handler-tx one.
  const jobEvents = [
    ...(without.has('handoff') ? [] : [eventOf(['hoA', 'hoB'], [0, 2])]),
    ...(without.has('handler-tx') ? [] : [eventOf(['htx'])]),
  ];
  const external = eventOf(['ext', 'switch']);
  const slot = fc.nat({ max: REPLICAS - 1 });
  const weighted: { arbitrary: fc.Arbitrary<ModelCommand>; weight: number; scenario?: Scenario }[] = [
    {
      arbitrary: fc
        .tuple(event, fc.integer({ min: 1, max: 3 }), slot)
        .map(([e, c, r]) => new Deliver(e, c, r)),
      weight: 3,
    },
    { arbitrary: fc.tuple(event, slot).map(([e, r]) => new FailOnce(e, r)), weight: 3 },
    {
      arbitrary: fc
        .tuple(event, fc.integer({ min: 2, max: 4 }), slot)
        .map(([e, c, r]) => new DeliverConcurrently(e, c, r)),
      weight: 2,
      scenario: 'concurrent',
    },
    {
      arbitrary: fc
        .tuple(event, fc.integer({ min: 1, max: 2 }), slot)
        .map(([e, c, r]) => new DuplicatesWhileParked(e, c, r)),
      weight: 2,
      scenario: 'concurrent',
    },
    {
      arbitrary: fc
        .tuple(event, fc.constantFrom<ModelPoint>('before-effect', 'after-effect'), slot)
        .map(([e, p, r]) => new KillDuringWork(e, p, r)),
      weight: 3,
      scenario: 'kill',
    },
    { arbitrary: external.map((e) => new ExpireLease(e)), weight: 2, scenario: 'expire' },
    {
      arbitrary: fc
        .tuple(
          without.has('overlap')
            ? fc.constant(undefined)
            : fc.option(fc.nat({ max: EVENTS_PER_ROUTE - 1 }), { nil: undefined }),
          fc.integer({ min: 1, max: 2 }),
        )
        .map(([o, c]) => new SwitchMode(o, c)),
      weight: 2,
      scenario: 'mode-switch',
    },
    {
      arbitrary: fc
        .tuple(fc.option(event, { nil: undefined }), event, slot)
        .map(([parked, probe, r]) => new RestartDatabase(parked, probe, r)),
      weight: 1,
      scenario: 'db-restart',
    },
  ];
  if (!without.has('job-kill') && jobEvents.length > 0)
    weighted.push({
      arbitrary: fc.tuple(fc.oneof(...jobEvents), slot).map(([e, r]) => new KillDuringJob(e, r)),
      weight: 2,
      scenario: 'job-kill',
    });
  if (!without.has('request'))
    weighted.push({
      arbitrary: fc
        .tuple(eventOf(['reqo']), fc.constantFrom(500, 502), slot)
        .map(([e, s, r]) => new Answer5xx(e, s, r)),
      weight: 2,
      scenario: 'handler-5xx',
    });
  const kept = weighted.filter((entry) => !entry.scenario || !without.has(entry.scenario));
  return [fc.oneof(...kept.map(({ arbitrary, weight }) => ({ arbitrary, weight })))];
}
