import { Injectable, type OnModuleInit } from '@nestjs/common';
import { DiscoveryService, MetadataScanner } from '@nestjs/core';
import { IDEMPOTENT_WEBHOOK_METADATA } from '../idempotency.constants.js';
import { ClaimDatabase } from '../postgres/claim-database.js';
import { assertVersionTable } from '../postgres/version-table.check.js';
import type { IdempotentWebhookMetadata } from './idempotent-webhook.decorator.js';

/**
 * Finds the handlers with an ordering guard (`@IdempotentWebhook({ order })`) at start-up and, when
 * there are any, checks that their versions table is there: a migration not run fails the boot,
 * naming them, instead of answering each of their deliveries 503.
 */
@Injectable()
export class OrderingExplorer implements OnModuleInit {
  constructor(
    private readonly discovery: DiscoveryService,
    private readonly scanner: MetadataScanner,
    private readonly database: ClaimDatabase,
  ) {}

  async onModuleInit(): Promise<void> {
    const ordered: string[] = [];
    for (const wrapper of this.discovery.getControllers()) {
      const type = wrapper.metatype as (new (...args: any[]) => unknown) | undefined;
      const prototype = type?.prototype as Record<string, unknown> | undefined;
      if (!type || !prototype) continue;
      for (const name of this.scanner.getAllMethodNames(prototype)) {
        const method = prototype[name];
        if (typeof method !== 'function') continue;
        const meta = Reflect.getMetadata(IDEMPOTENT_WEBHOOK_METADATA, method) as
          IdempotentWebhookMetadata | undefined;
        if (meta?.order) ordered.push(`${type.name}.${name}`);
      }
    }
    if (ordered.length > 0)
      await assertVersionTable(this.database.dataSource, this.database.versions, ordered);
  }
}
