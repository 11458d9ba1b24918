import { afterAll, beforeAll, describe, it } from '@jest/globals';
import fc from 'fast-check';
import type { AdapterName } from '../support/app.js';
import {
  drain,
  modelCommands,
  SCENARIOS,
  type ModelCommand,
  type Scenario,
} from '../support/model-commands.js';
import { PromiseBroken, ReferenceModel } from '../support/model-reference.js';
import { ModelSystem } from '../support/model-system.js';

/**
 * Model-based test of the library's promises where its features meet: random sequences of
 * deliveries (both modes, duplicates, concurrent copies, handler failures, SIGKILLs between claim
 * and commit, lease expiry, a scope's mode changed by a redeploy, claims nested in a delivery,
 * database restarts; 0 to 3 handoff jobs per delivery on one shared queue, from two scopes whose
 * events share keys, some with keys of their own, and the worker SIGKILLed mid-job; request mode
 * from two callers who send each other's keys, with JSON, text and binary bodies and 5xx answers
 * the handler sets; ordered deliveries; a handler's own transactions that roll back around
 * afterCommit and enqueue) run against two replicas of the real app in child processes; then
 * every event is redelivered until it is acknowledged, the jobs are left to settle, and the
 * database, the queue and the counting downstream are compared with the reference model
 * (test/support/model-reference.ts), which states the promises, not what the code does.
 * test/model/README.md says what it found before the fixes of issues 16 and 37.
 *
 * Environment:
 * - MODEL_SEED: fast-check's seed (default: random); printed with the shrunk commands on failure.
 * - MODEL_PATH and MODEL_REPLAY_PATH: with MODEL_SEED, replay the counterexample fast-check
 *   printed (its `path`, and the `replayPath` in the commands' comment) and nothing else.
 * - MODEL_RUNS: runs to try (default 20), within MODEL_BUDGET_MS (default 150000: `.ci/run`
 *   keeps this file to about three minutes). Once the budget is spent, the remaining runs (and
 *   shrinking steps) pass without running, so the result is the smallest failure found so far.
 * - MODEL_COMMANDS: commands per run at most (default 8).
 * - MODEL_MINIMIZE_MS: after a failure, how long a last pass may spend dropping commands that do
 *   not matter from the shrunk counterexample (default 45000).
 * - MODEL_VERBOSE=1: prints every run's steps.
 * - MODEL_WITHOUT: a comma-separated list of scenarios to leave out, for triage:
 *   mode-switch (every redeploy that flips a scope's mode), overlap (only the redeploys during
 *   which both releases hold the scope), nested, kill, db-restart, expire, concurrent, handoff
 *   (the two handoff scopes and their jobs), job-key (jobs with enqueue()'s own `key`), job-kill
 *   (a worker SIGKILLed mid-job), request (the request-mode route with two callers), handler-5xx
 *   (its handler answering a 5xx itself), ordering, handler-tx (the handler's own transactions).
 *   E.g. `MODEL_WITHOUT=mode-switch,nested` checks the rest of the model while those two are
 *   being fixed.
 */
const SEED =
  process.env.MODEL_SEED === undefined
    ? Date.now() ^ (Math.random() * 0x100000000)
    : Number(process.env.MODEL_SEED);
const RUNS = Number(process.env.MODEL_RUNS ?? 20);
const BUDGET_MS = Number(process.env.MODEL_BUDGET_MS ?? 150_000);
const VERBOSE = process.env.MODEL_VERBOSE === '1';
const MAX_COMMANDS = Number(process.env.MODEL_COMMANDS ?? 8);
const MINIMIZE_MS = Number(process.env.MODEL_MINIMIZE_MS ?? 45_000);
const WITHOUT = new Set(
  (process.env.MODEL_WITHOUT ?? '')
    .split(',')
    .map((name) => name.trim())
    .filter(Boolean),
);
if (!Number.isSafeInteger(SEED)) throw new Error(`MODEL_SEED: an integer, not ${process.env.MODEL_SEED}`);
for (const name of WITHOUT) {
  if (!(SCENARIOS as readonly string[]).includes(name))
    throw new Error(`MODEL_WITHOUT: unknown scenario ${name} (known: ${SCENARIOS.join(', ')})`);
}

describe('model: one visible effect per event, whatever happens to its deliveries', () => {
  let system: ModelSystem;

  beforeAll(async () => {
    system = await ModelSystem.start();
  }, 120_000);

  afterAll(async () => {
    await system?.close();
  }, 60_000);

  /** One run: a fresh model, the commands, the drain, the comparison. Rejects with what broke. */
  async function runOnce(
    run: number,
    adapter: AdapterName,
    commands: Iterable<ModelCommand>,
    executed: ModelCommand[],
  ): Promise<ReferenceModel> {
    const model = new ReferenceModel(`m${run}-`, !WITHOUT.has('job-key'));
    let passed = false;
    try {
      await system.ensure({ adapter, switchMode: model.switchMode });
      model.note(`run ${run} on ${adapter}, pids ${system.replica(0).pid} and ${system.replica(1).pid}`);
      await fc.asyncModelRun(() => ({ model, real: system }), track(commands, executed));
      await drain(model, system);
      await system.settle(model.prefix, model.callbacksDue());
      model.compare(await system.observe(model.prefix));
      passed = true;
      return model;
    } finally {
      // A failed run may have left a handler parked or the database down.
      if (!passed) await system.reset();
      if (VERBOSE) console.log(`run ${run} (${passed ? 'passed' : 'failed'}):\n${model.steps.join('\n')}`);
    }
  }

  it(
    'every event ends with its effect exactly once, against the reference model',
    async () => {
      const began = performance.now();
      const runs: { ms: number; passed: boolean }[] = [];
      let skipped = 0;
      let run = 0;
      let firstFailure: string | undefined;
      let lastFailure: { adapter: AdapterName; executed: ModelCommand[]; error: unknown } | undefined;
      const property = fc.asyncProperty(
        fc.constantFrom<AdapterName>('express', 'fastify'),
        fc.commands(modelCommands(WITHOUT as ReadonlySet<Scenario>), {
          maxCommands: MAX_COMMANDS,
          replayPath: process.env.MODEL_REPLAY_PATH,
        }),
        async (adapter, commands) => {
          // Past the budget every run passes at once: shrinking ends with the smallest failure so far.
          if (performance.now() - began > BUDGET_MS) {
            skipped++;
            return;
          }
          const started = performance.now();
          const executed: ModelCommand[] = [];
          let passed = false;
          try {
            await runOnce(++run, adapter, commands, executed);
            passed = true;
          } catch (error) {
            firstFailure ??= `run ${run}, after ${Math.round(performance.now() - began)} ms`;
            lastFailure = { adapter, executed, error };
            throw error;
          } finally {
            runs.push({ ms: Math.round(performance.now() - started), passed });
          }
        },
      );
      const details = await fc.check(property, {
        seed: SEED,
        numRuns: RUNS,
        path: process.env.MODEL_PATH,
        endOnFailure: process.env.MODEL_PATH !== undefined,
      });
      const ran = runs.length;
      const perRun = ran === 0 ? 0 : Math.round(runs.reduce((sum, r) => sum + r.ms, 0) / ran);
      const summary = () =>
        `model test: seed ${SEED}, ${ran} runs executed (${runs.filter((r) => !r.passed).length} failed` +
        `${firstFailure ? `, first at ${firstFailure}` : ''}; ${skipped} skipped past the ${BUDGET_MS} ms budget), ` +
        `${Math.round(performance.now() - began)} ms in all, ${perRun} ms per run` +
        (WITHOUT.size ? `, without ${[...WITHOUT].join(', ')}` : '');
      if (!details.failed || !lastFailure) {
        console.log(summary());
        if (details.failed) throw new Error(`${summary()}\n${fc.defaultReportMessage(details)}`);
        return;
      }
      const minimized = await minimize(lastFailure, () => ++run);
      console.log(summary());
      throw new Error(
        `${summary()}\n${fc.defaultReportMessage(details)}\n\n` +
          `Replay: MODEL_SEED=${SEED} MODEL_PATH=${details.counterexamplePath} MODEL_REPLAY_PATH=<the replayPath above> npm run test:model\n` +
          `Without the commands that do not matter: [${minimized.executed.join(', ')}] on ${minimized.adapter}; ` +
          'its failure is the cause below.',
        { cause: minimized.error },
      );
    },
    // The budget, plus the run in progress when it ran out, the shrinking's quick passes, and the
    // last pass over the counterexample.
    BUDGET_MS + MINIMIZE_MS + 180_000,
  );

  /**
   * fast-check shrinks a command list by dropping commands from its front, as a failure usually
   * shows in the last command run; here it shows in the drain after them, so a command after the
   * ones that matter stays. One pass from the end drops each command whose absence leaves the
   * same failure, within MINIMIZE_MS.
   */
  async function minimize(
    failure: { adapter: AdapterName; executed: ModelCommand[]; error: unknown },
    nextRun: () => number,
  ): Promise<{ adapter: AdapterName; executed: ModelCommand[]; error: unknown }> {
    const deadline = performance.now() + MINIMIZE_MS;
    let best = failure;
    for (let at = best.executed.length - 1; at >= 0 && performance.now() < deadline; at--) {
      const candidate = best.executed.filter((_, index) => index !== at);
      const executed: ModelCommand[] = [];
      try {
        await runOnce(nextRun(), best.adapter, candidate, executed);
      } catch (error) {
        if (sameBreak(error, best.error)) best = { adapter: best.adapter, executed, error };
      }
    }
    return best;
  }
});

/** Passes the commands on, recording each one fast-check runs (it skips those whose check fails). */
function* track(commands: Iterable<ModelCommand>, executed: ModelCommand[]): Iterable<ModelCommand> {
  for (const command of commands) {
    yield {
      check: (model) => command.check(model),
      run: async (model, real) => {
        executed.push(command);
        await command.run(model, real);
      },
      toString: () => command.toString(),
    };
  }
}

/** Two failures are the same when their first lines agree, the runs' event ids aside. */
function sameBreak(error: unknown, original: unknown): boolean {
  const line = (value: unknown) =>
    value instanceof PromiseBroken ? value.message.split('\n')[0].replace(/\bm\d+-/g, '') : undefined;
  return line(error) !== undefined && line(error) === line(original);
}
