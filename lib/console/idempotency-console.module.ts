import { Module, type DynamicModule } from '@nestjs/common';
import { consoleController, CONSOLE_CONFIG } from './console.controller.js';
import { resolveConsoleOptions, type IdempotencyConsoleOptions } from './console-options.js';

/**
 * A page in the browser for the people on call: claims by state (poison, expired, failed, in
 * flight) with their age, attempts and last error, the handoff's dead-lettered jobs, and the
 * actions of IdempotencyClaims (release, forget) and HandoffQueues (retry a dead-lettered job),
 * each behind a confirmation page and CSRF protection. Served by the app itself, rendered on the
 * server (no front-end build, no script in the page). Off unless imported, and it refuses to
 * boot without a token (or a guard of your own), and with a token that is unset or short:
 *
 * ```ts
 * @Module({
 *   imports: [
 *     IdempotencyModule.forRoot(),
 *     IdempotencyConsoleModule.forRoot({ token: process.env.CONSOLE_TOKEN }),
 *   ],
 * })
 * ```
 *
 * It uses IdempotencyModule's services, which are global by default; with `isGlobal: false`, pass
 * the module that exports them in `imports`.
 */
@Module({})
export class IdempotencyConsoleModule {
  /** The console at `path` (default `/idempotency`), behind `token` and/or `guard`. */
  static forRoot(options: IdempotencyConsoleOptions): DynamicModule {
    const config = resolveConsoleOptions(options);
    return {
      module: IdempotencyConsoleModule,
      imports: options.imports ?? [],
      controllers: [consoleController(config)],
      providers: [{ provide: CONSOLE_CONFIG, useValue: config }],
    };
  }
}
