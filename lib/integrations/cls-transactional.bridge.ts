/**
 * The one reach into @nestjs-cls/transactional's internals. A service marked `@Transactional()`
 * (nestjs-cls's transactional plugin, TypeORM adapter) that a transaction-mode handler calls
 * should write in the claim's transaction, so that its writes commit with the claim or not at all.
 * The plugin keeps the current transaction per connection name in its CLS store, and has no
 * public way to hand it one that is already open: every adapter's `wrapWithTransaction` sets it
 * through TransactionHost's private `setTxInstance(tx)` (present with this name and signature
 * since @nestjs-cls/transactional 2.0). The bridge calls that, inside a child CLS context of its
 * own (`ifNested: 'inherit'`), so the request's context never holds the claim's manager after the
 * delivery, and concurrent deliveries in one context stay apart. A probe at boot, through public
 * API only (`isTransactionActive()`, `tx`), fails the boot if a release moves it.
 *
 * Both packages are optional: they are loaded once at boot, and without them (or without a
 * TransactionHost on the claims' DataSource) a delivery pays one `=== undefined` test.
 */
import type { DataSource, EntityManager } from 'typeorm';
import { loadOptionalPeer } from '../core/optional-peer.js';

/** The public surface of TransactionHost the bridge reads, plus the one private method it calls. */
interface TransactionHostInternals {
  readonly tx: unknown;
  isTransactionActive(): boolean;
  /** Private in TransactionHost (transaction-host.ts `setTxInstance`). */
  setTxInstance(tx?: unknown): void;
}

/** The public surface of nestjs-cls's ClsService the bridge uses. */
interface ClsServiceLike {
  run<T>(options: { ifNested: 'inherit' | 'override' }, callback: () => T): T;
  exit<T>(callback: () => T): T;
}

/** The claim's transaction, made the active one of nestjs-cls's transactional plugin. */
export interface ClsTransactionBridge {
  /** The connection names bridged (one TransactionHost each), for the boot log. */
  readonly hosts: number;
  /**
   * Runs `fn` in a child CLS context (a new one when none is active) in which `manager` is the
   * active transaction of every TransactionHost on the claims' DataSource.
   */
  run<T>(manager: EntityManager, fn: () => T): T;
}

/** Thrown at boot when the plugin no longer has what the bridge relies on. */
const bridgeBroken = (what: string) =>
  `@nestjs-cls/transactional: ${what}, so @Transactional() services called from a handler could not ` +
  `join the claim's transaction. Pin @nestjs-cls/transactional to a release this library supports ` +
  `(^3), or report it.`;

/**
 * The bridge for `dataSource`, or undefined when there is nothing to bridge: nestjs-cls or its
 * transactional plugin not installed, or no TransactionHost whose transactions run on
 * `dataSource` among `providers` (the app's provider instances, from DiscoveryService).
 */
export async function createClsTransactionBridge(
  dataSource: DataSource,
  providers: Iterable<unknown>,
): Promise<ClsTransactionBridge | undefined> {
  let TransactionHost: abstract new (...args: any[]) => unknown;
  let cls: ClsServiceLike;
  try {
    const transactional = await loadOptionalPeer<Record<string, any>>('@nestjs-cls/transactional');
    const core = await loadOptionalPeer<Record<string, any>>('nestjs-cls');
    TransactionHost = transactional.TransactionHost ?? transactional.default?.TransactionHost;
    const manager = core.ClsServiceManager ?? core.default?.ClsServiceManager;
    if (typeof manager?.getClsService !== 'function') return undefined;
    cls = manager.getClsService();
  } catch {
    return undefined;
  }
  if (typeof TransactionHost !== 'function') return undefined;
  // Outside any CLS context a host's `tx` is its adapter's fallback: for the TypeORM adapter, the
  // DataSource's own manager. That tells which hosts serve the claims' DataSource.
  const hosts = [...new Set(providers)].filter(
    (instance): instance is TransactionHostInternals =>
      instance instanceof TransactionHost &&
      cls.exit(() => (instance as TransactionHostInternals).tx) === dataSource.manager,
  );
  if (hosts.length === 0) return undefined;
  for (const host of hosts) assertBridgeable(host, cls);
  return {
    hosts: hosts.length,
    run: (manager, fn) =>
      cls.run({ ifNested: 'inherit' }, () => {
        for (const host of hosts) host.setTxInstance(manager);
        return fn();
      }),
  };
}

/**
 * Fails the boot when TransactionHost has no `setTxInstance`, or when a transaction set through it
 * is not what the host then reports (a second copy of nestjs-cls, whose store the host does not read).
 */
function assertBridgeable(host: TransactionHostInternals, cls: ClsServiceLike): void {
  if (typeof host.setTxInstance !== 'function')
    throw new Error(bridgeBroken('TransactionHost#setTxInstance() moved'));
  const probe = { probe: true };
  const seen = cls.exit(() =>
    cls.run({ ifNested: 'override' }, () => {
      host.setTxInstance(probe);
      return host.isTransactionActive() && host.tx === probe;
    }),
  );
  if (!seen) throw new Error(bridgeBroken('a transaction set on TransactionHost is not seen by it'));
}
