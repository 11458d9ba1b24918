import type { LoggerService } from '@nestjs/common';

/** One line a Nest logger was asked to write. */
export interface CapturedLine {
  level: 'log' | 'error' | 'warn' | 'debug' | 'verbose' | 'fatal';
  message: string;
  context?: string;
}

/**
 * A LoggerService that records lines instead of printing them, so tests can assert on what the
 * library logged. `app.useLogger(capture)` installs it; Nest's Logger is process-wide, so every
 * app in the test file (and every `new Logger(...)` in the library) writes to the last one installed.
 */
export class LogCapture implements LoggerService {
  readonly lines: CapturedLine[] = [];

  log(message: unknown, ...rest: unknown[]): void {
    this.record('log', message, rest);
  }
  error(message: unknown, ...rest: unknown[]): void {
    this.record('error', message, rest);
  }
  warn(message: unknown, ...rest: unknown[]): void {
    this.record('warn', message, rest);
  }
  debug(message: unknown, ...rest: unknown[]): void {
    this.record('debug', message, rest);
  }
  verbose(message: unknown, ...rest: unknown[]): void {
    this.record('verbose', message, rest);
  }
  fatal(message: unknown, ...rest: unknown[]): void {
    this.record('fatal', message, rest);
  }

  /** Lines of `level` whose message contains every one of `parts`. */
  find(level: CapturedLine['level'], ...parts: string[]): CapturedLine[] {
    return this.lines.filter(
      (line) => line.level === level && parts.every((part) => line.message.includes(part)),
    );
  }

  /** Forgets what was recorded so far. */
  clear(): void {
    this.lines.length = 0;
  }

  /** Resolves with the first matching lines once there are any; rejects after `timeoutMs`. */
  async waitFor(level: CapturedLine['level'], parts: string[], timeoutMs = 10_000): Promise<CapturedLine[]> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      const found = this.find(level, ...parts);
      if (found.length > 0) return found;
      if (Date.now() > deadline) {
        throw new Error(`no ${level} line containing ${JSON.stringify(parts)} within ${timeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 25));
    }
  }

  private record(level: CapturedLine['level'], message: unknown, rest: unknown[]): void {
    // Nest passes the context as the last string argument (after a stack for errors).
    const last = rest.at(-1);
    this.lines.push({
      level,
      message: typeof message === 'string' ? message : JSON.stringify(message),
      context: typeof last === 'string' ? last : undefined,
    });
  }
}
