import type { DiscoveryService, MetadataScanner } from '@nestjs/core';
import type { InstanceWrapper } from '@nestjs/core/injector/instance-wrapper.js';
import { IDEMPOTENT_METHOD_METADATA, IDEMPOTENT_WEBHOOK_METADATA } from '../../idempotency.constants.js';
import { unprotectedHandlers } from '../../idempotency.messages.js';
import { IDEMPOTENT_WORKER_METADATA, type IdempotentWorkerMetadata } from './idempotent-worker.decorator.js';
import type { WorkerRegistration } from './worker-loop.js';

const workerOnController = (where: string) =>
  `@IdempotentWorker on ${where}: a controller; workers are provider methods, called with each job`;

const workerNotStatic = (where: string, token: string) =>
  `@IdempotentWorker on ${where}: the provider ${token} is request-scoped or transient, so there is no one instance to run its jobs; make it a singleton`;

const workerAlsoIdempotent = (where: string) =>
  `@IdempotentWorker on ${where}: the method also carries @Idempotent or @IdempotentWebhook; the worker already runs each job under a claim, so keep one decorator`;

/**
 * Every `@IdempotentWorker` method of the app, found as @nestjs/schedule finds its jobs
 * (DiscoveryService), or the boot's refusal naming each one that cannot run: on a controller,
 * on a request-scoped or transient provider (no single instance to call), or also decorated
 * `@Idempotent` / `@IdempotentWebhook` (two claims for one job).
 */
export function findWorkers(discovery: DiscoveryService, scanner: MetadataScanner): WorkerRegistration[] {
  const problems: string[] = [];
  const workers: WorkerRegistration[] = [];
  for (const wrapper of discovery.getControllers()) {
    for (const { where } of workerMethods(wrapper, scanner)) problems.push(workerOnController(where));
  }
  for (const wrapper of discovery.getProviders()) {
    for (const { where, name, method, metadata } of workerMethods(wrapper, scanner)) {
      const instance = wrapper.instance as Record<string, unknown> | undefined;
      if (!wrapper.isDependencyTreeStatic() || wrapper.isTransient || !instance) {
        problems.push(workerNotStatic(where, String(wrapper.name)));
      } else if (
        Reflect.hasMetadata(IDEMPOTENT_METHOD_METADATA, method) ||
        Reflect.hasMetadata(IDEMPOTENT_WEBHOOK_METADATA, method)
      ) {
        problems.push(workerAlsoIdempotent(where));
      } else {
        const bound = instance[name] as (job: unknown) => unknown;
        workers.push({ ...metadata, where, call: (job) => bound.call(instance, job) });
      }
    }
  }
  if (problems.length > 0) throw new Error(unprotectedHandlers(problems));
  return workers;
}

/** The `@IdempotentWorker` methods of one controller or provider. */
function* workerMethods(wrapper: InstanceWrapper, scanner: MetadataScanner) {
  const instance = wrapper.instance as object | undefined;
  // useValue and useFactory providers have only their instance's class.
  const type = (instance && typeof instance === 'object' ? instance.constructor : wrapper.metatype) as
    (new (...args: any[]) => unknown) | undefined;
  const prototype = typeof type === 'function' ? (type.prototype as Record<string, unknown>) : undefined;
  if (!prototype) return;
  for (const name of scanner.getAllMethodNames(prototype)) {
    const method = prototype[name];
    if (typeof method !== 'function') continue;
    const metadata = Reflect.getMetadata(IDEMPOTENT_WORKER_METADATA, method) as
      IdempotentWorkerMetadata | undefined;
    if (metadata) yield { where: `${type!.name}.${name}`, name, method, metadata };
  }
}
