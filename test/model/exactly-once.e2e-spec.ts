import { afterAll, beforeAll, describe, it } from '@jest/globals';
import fc from 'fast-check';
import type { AdapterName } from '../support/app.js';
import { drain, modelCommands, SCENARIOS, type Scenario } from '../support/model-commands.js';
import { ReferenceModel } from '../support/model-reference.js';
import { ModelSystem } from '../support/model-system.js';

/**
 * Model-based test of the one promise: random sequences of deliveries (both modes, duplicates,
 * concurrent copies, handler failures, SIGKILLs between claim and commit, lease expiry, a
 * scope's mode changed by a redeploy, claims nested in a delivery, database restarts) run
 * against the real app in a child process, then every event is redelivered until it is
 * acknowledged, and the database and the counting downstream are compared with the reference
 * model (test/support/model-reference.ts), which states the promise, not what the code does.
 *
 * Environment:
 * - MODEL_SEED: fast-check's seed (default: random); printed with the shrunk commands on failure.
 * - MODEL_PATH and MODEL_REPLAY_PATH: with MODEL_SEED, replay the counterexample fast-check
 *   printed (its `path`, and the `replayPath` in the commands' comment) and nothing else.
 * - MODEL_RUNS: runs to try (default 20), within MODEL_BUDGET_MS (default 150000: `.ci/run`
 *   keeps this file to about three minutes). Once the budget is spent, the remaining runs (and
 *   shrinking steps) pass without running, so the result is the smallest failure found so far.
 * - MODEL_COMMANDS: commands per run at most (default 8).
 * - MODEL_VERBOSE=1: prints every run's steps.
 * - MODEL_WITHOUT: a comma-separated list of scenarios to leave out, for triage:
 *   mode-switch (every redeploy that flips a scope's mode), overlap (only the redeploys during
 *   which both releases hold the scope), nested, kill, db-restart, expire, concurrent. E.g.
 *   `MODEL_WITHOUT=mode-switch,nested` checks the rest of the model while those two are being fixed.
 */
const SEED =
  process.env.MODEL_SEED === undefined
    ? Date.now() ^ (Math.random() * 0x100000000)
    : Number(process.env.MODEL_SEED);
const RUNS = Number(process.env.MODEL_RUNS ?? 20);
const BUDGET_MS = Number(process.env.MODEL_BUDGET_MS ?? 150_000);
const VERBOSE = process.env.MODEL_VERBOSE === '1';
const MAX_COMMANDS = Number(process.env.MODEL_COMMANDS ?? 8);
const WITHOUT = new Set(
  (process.env.MODEL_WITHOUT ?? '')
    .split(',')
    .map((name) => name.trim())
    .filter(Boolean),
);
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

  it(
    'every event ends with its effect exactly once, against the reference model',
    async () => {
      const began = performance.now();
      const runs: { ms: number; steps: number; passed: boolean }[] = [];
      let skipped = 0;
      let run = 0;
      const property = fc.asyncProperty(
        fc.constantFrom<AdapterName>('express', 'fastify'),
        fc.commands(modelCommands(WITHOUT as ReadonlySet<Scenario>), {
          maxCommands: MAX_COMMANDS,
          replayPath: process.env.MODEL_REPLAY_PATH,
        }),
        async (adapter, commands) => {
          if (performance.now() - began > BUDGET_MS) {
            skipped++;
            return;
          }
          const started = performance.now();
          const model = new ReferenceModel(`m${++run}-`);
          let passed = false;
          let steps = 0;
          try {
            await system.ensure({ adapter, switchMode: model.switchMode });
            model.note(
              `run ${run} on ${adapter}, pids ${system.replica(0).pid} and ${system.replica(1).pid}`,
            );
            await fc.asyncModelRun(() => ({ model, real: system }), commands);
            steps = model.steps.length;
            await drain(model, system);
            model.compare(await system.effects(model.prefix), await system.claims(model.prefix));
            passed = true;
          } finally {
            // A failed run may have left a handler parked or the database down.
            if (!passed) await system.reset();
            if (VERBOSE)
              console.log(`run ${run} (${passed ? 'passed' : 'failed'}):\n${model.steps.join('\n')}`);
            runs.push({ ms: Math.round(performance.now() - started), steps, passed });
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
      const total = Math.round(performance.now() - began);
      const perRun = ran === 0 ? 0 : Math.round(runs.reduce((sum, r) => sum + r.ms, 0) / ran);
      const summary =
        `model test: seed ${SEED}, ${ran} runs executed (${runs.filter((r) => !r.passed).length} failed, ` +
        `${skipped} skipped past the ${BUDGET_MS} ms budget), ${total} ms in all, ${perRun} ms per run` +
        (WITHOUT.size ? `, without ${[...WITHOUT].join(', ')}` : '');
      console.log(summary);
      if (details.failed) {
        throw new Error(
          `${summary}\n${fc.defaultReportMessage(details)}\n\n` +
            `Replay: MODEL_SEED=${SEED} MODEL_PATH=${details.counterexamplePath} MODEL_REPLAY_PATH=<the replayPath above> npm run test:model`,
          { cause: details.errorInstance },
        );
      }
    },
    // The budget, plus the run in progress when it ran out, plus the shrinking's quick passes.
    BUDGET_MS + 180_000,
  );
});
