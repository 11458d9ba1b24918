import {
  Body,
  Controller,
  Get,
  Inject,
  Injectable,
  Param,
  Post,
  Query,
  Req,
  Res,
  UseGuards,
  type Type,
} from '@nestjs/common';
import type { ClaimListStatus } from '../interfaces/index.js';
import { IdempotencyClaims } from '../operator/idempotency-claims.service.js';
import { HandoffQueues } from '../transports/queue/handoff-queues.service.js';
import { csrfRefusal, csrfToken, CSRF_FIELD, type RequestHeaders } from './console-csrf.js';
import type { ConsoleConfig } from './console-options.js';
import {
  renderConfirmPage,
  renderConsolePage,
  renderMessagePage,
  type ConsoleAction,
  type Notice,
} from './console-page.renderer.js';

/** DI token of the console's resolved options. */
export const CONSOLE_CONFIG = Symbol('IDEMPOTENCY_CONSOLE_CONFIG');

/** The states the page lists, in its order: what needs a person first. */
const LISTED: readonly ClaimListStatus[] = ['poison', 'expired', 'failed', 'in_progress'];

const ACTIONS: readonly ConsoleAction[] = ['release', 'forget', 'retry'];

/** The request and reply surface used here, common to Express and Fastify. */
interface ConsoleRequest {
  headers: RequestHeaders;
  /** Express: the URL before any router stripped its mount path. */
  originalUrl?: string;
  url: string;
  /** Express. */
  secure?: boolean;
  /** Fastify. */
  protocol?: string;
}
interface ConsoleReply {
  header(name: string, value: string): unknown;
  status(code: number): unknown;
  send(body: string): unknown;
}

/**
 * Headers of every console answer: nothing is cached or framed, and the page may load nothing
 * (its style is inline) and post forms only to itself.
 */
const SECURITY_HEADERS: Readonly<Record<string, string>> = {
  'Content-Security-Policy':
    "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
  'X-Frame-Options': 'DENY',
  'X-Content-Type-Options': 'nosniff',
  'Referrer-Policy': 'same-origin',
  'Cache-Control': 'no-store',
};

/**
 * Answers with `status` and `html` through the platform's own reply (Express and Fastify both have
 * status(), header() and send()), with the security headers: the routes take the reply
 * themselves, so that an error page keeps its status.
 */
function send(reply: ConsoleReply, status: number, html: string): void {
  reply.status(status);
  reply.header('Content-Type', 'text/html; charset=utf-8');
  for (const [name, value] of Object.entries(SECURITY_HEADERS)) reply.header(name, value);
  reply.send(html);
}

function notFound(reply: ConsoleReply, title: string, base: string, message: string): void {
  send(reply, 404, renderMessagePage(title, base, 'Not found', message));
}

function isSecure(request: ConsoleRequest): boolean {
  return request.secure === true || request.protocol === 'https';
}

/** The console's own path from a request to one of its routes (a global prefix included). */
function basePath(request: ConsoleRequest): string {
  const path = (request.originalUrl ?? request.url).split('?')[0]!;
  return path.replace(/\/(confirm|actions\/[a-z]+)\/?$/, '').replace(/\/+$/, '') || '/';
}

const text = (value: unknown) => (typeof value === 'string' ? value : '');

/**
 * The console's routes: `GET /` lists claims and dead letters, `GET /confirm` asks before an
 * action, `POST /actions/:action` does it (CSRF-checked) and sends the browser back to the list
 * with what happened. Made into a controller per `forRoot()` (consoleController()), at the path
 * and behind the token and guard its options name.
 */
@Injectable()
export class ConsoleRoutes {
  constructor(
    @Inject(CONSOLE_CONFIG) private readonly config: ConsoleConfig,
    private readonly claims: IdempotencyClaims,
    private readonly queues: HandoffQueues,
  ) {}

  @Get()
  async list(
    @Req() request: ConsoleRequest,
    @Res() reply: ConsoleReply,
    @Query() query: Record<string, unknown>,
  ): Promise<void> {
    const { limit, title } = this.config;
    const sections = await Promise.all(
      LISTED.map(async (status) => {
        const claims = await this.claims.list({ status, limit });
        // A poison event has a section of its own: listed once, there.
        return { status, claims: status === 'poison' ? claims : claims.filter((claim) => !claim.poison) };
      }),
    );
    const stats = await this.queues.stats();
    const deadLetters = Object.keys(stats).length > 0 ? await this.queues.deadLetters(limit) : undefined;
    const base = basePath(request);
    send(
      reply,
      200,
      renderConsolePage({ title, base, sections, deadLetters, limit, notice: noticeOf(query) }),
    );
  }

  @Get('confirm')
  async confirm(
    @Req() request: ConsoleRequest,
    @Res() reply: ConsoleReply,
    @Query() query: Record<string, unknown>,
  ): Promise<void> {
    const { title } = this.config;
    const base = basePath(request);
    const action = query.action as ConsoleAction;
    if (!ACTIONS.includes(action)) {
      return send(
        reply,
        400,
        renderMessagePage(title, base, 'Unknown action', `There is no action ${text(action)}.`),
      );
    }
    const { token, setCookie } = csrfToken(request.headers, base, isSecure(request));
    if (setCookie) reply.header('Set-Cookie', setCookie);
    if (action === 'retry') {
      const queue = text(query.queue);
      const id = text(query.id);
      const job = (await this.queues.deadLetters(1_000)).find(
        (candidate) => candidate.id === id && candidate.queue.split(', ').includes(queue),
      );
      if (!job)
        return notFound(
          reply,
          title,
          base,
          `No dead-lettered job ${id} of queue ${queue} waits to be retried.`,
        );
      return send(reply, 200, renderConfirmPage({ title, base, token, action, job, fields: { queue, id } }));
    }
    const scope = text(query.scope);
    const key = text(query.key);
    const claim = scope && key ? await this.claims.show(scope, key) : undefined;
    if (!claim) return notFound(reply, title, base, `There is no claim of ${key} under ${scope}.`);
    send(reply, 200, renderConfirmPage({ title, base, token, action, claim, fields: { scope, key } }));
  }

  @Post('actions/:action')
  async act(
    @Req() request: ConsoleRequest,
    @Res() reply: ConsoleReply,
    @Param('action') action: string,
    @Body() body: Record<string, unknown> | undefined,
  ): Promise<void> {
    const { title } = this.config;
    const base = basePath(request);
    const refusal = csrfRefusal(request.headers, body?.[CSRF_FIELD]);
    if (refusal) {
      const message = `The action was refused: ${refusal}. Reload the console and try again.`;
      return send(reply, 403, renderMessagePage(title, base, 'Nothing was done', message));
    }
    const outcome = await this.perform(action, body ?? {});
    if (outcome === undefined) {
      return send(
        reply,
        400,
        renderMessagePage(title, base, 'Unknown action', `There is no action ${action}.`),
      );
    }
    // 303: the browser follows with a GET, so reloading the list does not post the action again.
    reply.header('Location', `${base}?${new URLSearchParams(outcome).toString()}`);
    send(reply, 303, '');
  }

  /** Runs one action; the query string of the notice it leaves, or undefined for no such action. */
  private async perform(
    action: string,
    body: Record<string, unknown>,
  ): Promise<Record<string, string> | undefined> {
    const scope = text(body.scope);
    const key = text(body.key);
    switch (action) {
      case 'release': {
        const result = await this.claims.release(scope, key);
        return result.released
          ? { done: 'released', scope, key }
          : { done: 'refused', action, reason: result.refusal.reason, scope, key };
      }
      case 'forget': {
        // The confirmation page is the operator's force: true.
        const result = await this.claims.forget(scope, key, { force: true });
        return result.forgotten
          ? { done: 'forgotten', scope, key }
          : { done: 'refused', action, reason: result.refusal.reason, scope, key };
      }
      case 'retry': {
        const queue = text(body.queue);
        const id = text(body.id);
        const result = await this.queues.retryDeadLetter(queue, id);
        return result.retried
          ? { done: 'retried', queue, id, job: result.jobId }
          : { done: 'refused', action, reason: result.reason, queue, id };
      }
      default:
        return undefined;
    }
  }
}

/** Why an action changed nothing, in words, by IdempotencyClaims' and HandoffQueues' reasons. */
const REFUSALS: Readonly<Record<string, string>> = {
  not_found: 'it is not there (any more)',
  done: 'it is done: there is no lease to release (forget it instead)',
  failed: 'it holds no lease: its next delivery claims it already',
  live_lease: 'a delivery holds a live lease on it: release it first',
  locked: 'a delivery is running it in a transaction right now; try again once it finishes',
  unknown_queue: 'that is not a queue of the handoff',
  force_required: 'forgetting needs confirmation',
};

/**
 * The notice of the last action, from the codes the action put in the query string (never free
 * text from it: a link cannot make the console say something it did not).
 */
function noticeOf(query: Record<string, unknown>): Notice | undefined {
  const what = `${text(query.key) || text(query.id)} (${text(query.scope) || text(query.queue)})`;
  switch (query.done) {
    case 'released':
      return { tone: 'ok', text: `Released ${what}: its next delivery claims it.` };
    case 'forgotten':
      return { tone: 'ok', text: `Forgot ${what}: its next delivery runs the handler again.` };
    case 'retried':
      return { tone: 'ok', text: `Queued ${what} again as job ${text(query.job)}.` };
    case 'refused': {
      const reason = REFUSALS[text(query.reason)] ?? 'it was refused';
      return { tone: 'refused', text: `Did not ${text(query.action) || 'act on'} ${what}: ${reason}.` };
    }
    default:
      return undefined;
  }
}

/** The console's controller at `config.path`, behind `config.guards` (its token's check first). */
export function consoleController(config: ConsoleConfig): Type<ConsoleRoutes> {
  @Controller(config.path)
  @UseGuards(...config.guards)
  class IdempotencyConsoleController extends ConsoleRoutes {}
  return IdempotencyConsoleController;
}
