import type { Provider, Type } from '@nestjs/common';

/**
 * The providers of a registry: each class in `entries`, and under `token` a Map from entry name
 * to its instance. The claim strategies (by mode) and the delivery transports (by context type)
 * are registries, so a new one is a class and an entry.
 */
export function registryProviders<T>(token: symbol, entries: Record<string, Type<T>>): Provider[] {
  const names = Object.keys(entries);
  const types = names.map((name) => entries[name]);
  return [
    ...types,
    {
      provide: token,
      inject: types,
      useFactory: (...instances: T[]): ReadonlyMap<string, T> =>
        new Map(names.map((name, index) => [name, instances[index]])),
    },
  ];
}
