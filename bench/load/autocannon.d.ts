/** The part of autocannon's API the bench uses (the package ships no types). */
declare module 'autocannon' {
  import type { EventEmitter } from 'node:events';

  interface RequestOptions {
    method?: string;
    path?: string;
    headers?: Record<string, string>;
    body?: string;
  }

  interface Request extends RequestOptions {
    setupRequest?(request: RequestOptions, context: Record<string, any>): RequestOptions;
    onResponse?(status: number, body: string, context: Record<string, any>): void;
  }

  interface Options {
    url: string;
    connections?: number;
    duration?: number;
    timeout?: number;
    sampleInt?: number;
    overallRate?: number;
    requests?: Request[];
  }

  interface Result {
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    statusCodeStats: Record<string, { count: number }>;
    requests: { total: number; average: number };
  }

  interface Instance extends EventEmitter, PromiseLike<Result> {
    stop(): void;
  }

  function autocannon(options: Options): Instance;
  export default autocannon;
}
