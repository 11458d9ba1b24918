import type { INestApplication, LogLevel } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';

/**
 * The child's side of forkGatedChild's protocol (test/support/gated-child.ts), shared by every
 * fixture child (test/fixtures/*-child.ts): each entry point keeps only what is its own, the
 * module it boots and the settings that shape it.
 */

/**
 * Starts a fixture child: ties its life to the parent's (a child whose test runner died would
 * otherwise keep its port, its connections and its jobs) and returns the settings the parent sent
 * as JSON in the environment variable `variable`.
 * @default variable 'FIXTURE_SETTINGS'
 */
export function enterChild<Settings>(variable = 'FIXTURE_SETTINGS'): Settings {
  process.on('disconnect', () => process.exit(1));
  return JSON.parse(process.env[variable] ?? '{}') as Settings;
}

/** What NestFactory boots: a module class or a dynamic module. */
export type EntryModule = Parameters<typeof NestFactory.create>[0];

/** Options of listenInChild. */
export interface ChildHttpOptions {
  /**
   * The HTTP platform: 'fastify', or anything else for Express.
   * @default Express
   */
  adapter?: string;
  /**
   * Nest's log levels in the child (what the parent reads in `output()` when a test fails).
   * @default ['error', 'warn']
   */
  logger?: LogLevel[];
  /**
   * Nest's `rawBody` option, for fixtures whose handlers read the bytes received.
   * @default false
   */
  rawBody?: boolean;
}

/** Boots `module` as an HTTP app on a free loopback port; resolves with the app and its URL. */
export async function listenInChild(
  module: EntryModule,
  options: ChildHttpOptions = {},
): Promise<{ app: INestApplication; url: string }> {
  const nestOptions = { logger: options.logger ?? ['error', 'warn'], rawBody: options.rawBody ?? false };
  const app =
    options.adapter === 'fastify'
      ? await NestFactory.create(module, new FastifyAdapter(), nestOptions)
      : await NestFactory.create(module, nestOptions);
  await app.listen(0, '127.0.0.1');
  return { app, url: await app.getUrl() };
}

/** What a child answers besides `ready`. */
export interface ChildAnswers {
  /**
   * The fixture's gates (Gates in test/fixtures/webhook-fixture.module.ts): `{ open: id }` lets
   * the handler parked at `id` go on.
   * @default none: the child's handlers never park
   */
  gates?: { open(id: string): void };
  /**
   * Questions the parent may ask (GatedChild.ask): `{ <question>: true }` is answered
   * `{ <question>: questions[question]() }`.
   * @default none
   */
  questions?: Record<string, () => unknown>;
}

/** Answers the parent's messages, as `answers` says. */
export function answerParent(answers: ChildAnswers): void {
  const { gates, questions = {} } = answers;
  process.on('message', (message: Record<string, unknown>) => {
    if (typeof message.open === 'string') gates?.open(message.open);
    for (const [question, answer] of Object.entries(questions)) {
      if (message[question]) process.send?.({ [question]: answer() });
    }
  });
}

/** Tells the parent the child has started: `value` is its URL, its port, or `true`. */
export function reportReady(value: unknown): void {
  process.send?.({ ready: value });
}
