import {
  Body,
  Controller,
  HttpCode,
  Inject,
  Injectable,
  Module,
  Post,
  type DynamicModule,
} from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import {
  idempotencyEntities,
  IdempotencyContext,
  IdempotencyModule,
  IdempotentWebhook,
  IdempotentWorker,
  type HandoffJob,
} from '../../lib/index.js';
import type { BenchEvent } from '../load/stripe-event.js';

/** The queue the handoff route writes and the worker reads. */
export const BENCH_QUEUE = 'bench-downstream';
/** DI token of the slow downstream's URL. */
export const DOWNSTREAM_URL = Symbol('DOWNSTREAM_URL');
/** Jobs the worker process runs at once (each waits 300 ms on the downstream). */
export const WORKER_CONCURRENCY = Number(process.env.BENCH_WORKER_CONCURRENCY ?? 32);

const RECEIVED = { received: true };
const eventKey = (event: BenchEvent) => event.id;

/** POSTs to the downstream with the event's Idempotency-Key; a non-2xx answer throws. */
async function callDownstream(url: string, key: string): Promise<void> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify({ eventId: key }),
    signal: AbortSignal.timeout(10_000),
  });
  await response.arrayBuffer();
  if (!response.ok) throw new Error(`downstream answered ${response.status}`);
}

/**
 * The routes the handoff bench compares: a floor (no database), the library's transaction mode with a no-op
 * handler (the floor of an acknowledgement), the handoff (claim + job in one COMMIT), and the
 * inline external mode that calls the 300 ms downstream before answering.
 */
@Controller()
export class HandoffBenchController {
  constructor(
    private readonly context: IdempotencyContext,
    @Inject(DOWNSTREAM_URL) private readonly downstreamUrl: string,
  ) {}

  /** The machine's floor: a Nest route that answers at once, no claim, no database. */
  @Post('floor')
  @HttpCode(200)
  floor() {
    return RECEIVED;
  }

  @Post('lib-tx-noop')
  @HttpCode(200)
  @IdempotentWebhook({ key: eventKey, scope: 'bench:lib-tx-noop', source: 'stripe' })
  async noop(@Body() _event: BenchEvent) {
    return RECEIVED;
  }

  @Post('handoff')
  @HttpCode(200)
  @IdempotentWebhook({ key: eventKey, scope: 'bench:handoff', source: 'stripe' })
  async handoff(@Body() event: BenchEvent) {
    await this.context.enqueue(BENCH_QUEUE, { eventId: event.id });
    return RECEIVED;
  }

  @Post('inline-external')
  @HttpCode(200)
  @IdempotentWebhook({ key: eventKey, scope: 'bench:inline-external', source: 'stripe', external: true })
  async inline(@Body() event: BenchEvent) {
    await callDownstream(this.downstreamUrl, event.id);
    return RECEIVED;
  }
}

/** The handoff's worker: external mode, the same downstream call as the inline route. */
@Injectable()
export class HandoffBenchWorker {
  constructor(@Inject(DOWNSTREAM_URL) private readonly downstreamUrl: string) {}

  @IdempotentWorker(BENCH_QUEUE, { external: true, concurrency: WORKER_CONCURRENCY, scope: 'bench:worker' })
  async run(job: HandoffJob<{ eventId: string }>) {
    await callDownstream(this.downstreamUrl, job.key);
  }
}

/** Settings of one bench process. */
export interface HandoffBenchSettings {
  databaseUrl: string;
  downstreamUrl: string;
  poolSize: number;
  role: 'web' | 'worker';
}

/** The bench app: the webhook routes (role web) or the worker (role worker), the library's defaults. */
@Module({})
export class HandoffBenchModule {
  static forRoot(settings: HandoffBenchSettings): DynamicModule {
    return {
      module: HandoffBenchModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: settings.databaseUrl,
          entities: [...idempotencyEntities()],
          extra: { max: settings.poolSize },
          retryAttempts: 0,
        }),
        IdempotencyModule.forRoot({
          reporter: false,
          prometheus: false,
          handoff: {
            queues: { [BENCH_QUEUE]: { expireInSeconds: 60 } },
            // A busy worker fetches again as soon as a job ends; idle polling only matters at the start.
            pollingIntervalMs: 200,
          },
        }),
      ],
      controllers: settings.role === 'web' ? [HandoffBenchController] : [],
      providers: [
        { provide: DOWNSTREAM_URL, useValue: settings.downstreamUrl },
        ...(settings.role === 'worker' ? [HandoffBenchWorker] : []),
      ],
    };
  }
}
