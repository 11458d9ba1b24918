import { round } from '../load/percentiles.js';

/** The parts of a V8 `.cpuprofile` read here. */
export interface CpuProfile {
  nodes: {
    id: number;
    callFrame: { functionName: string; url: string; lineNumber: number };
    children?: number[];
  }[];
  samples: number[];
  timeDeltas: number[];
}

/** Where the server's CPU went while it answered `events` deliveries of one variant. */
export interface CpuAttribution {
  events: number;
  /** Sampled on-CPU time of the main thread (idle excluded), per event. */
  cpuUsPerEvent: number;
  /** Self time in frames of the compiled library (dist/lib), per event and as a share. */
  libraryUsPerEvent: number;
  libraryShare: number;
  /** Self time of samples with a library frame anywhere on the stack (what it runs synchronously). */
  libraryInclusiveUsPerEvent: number;
  libraryInclusiveShare: number;
  /** Self time per group (library, @nestjs, typeorm, pg, ...), µs per event, largest first. */
  groups: { group: string; usPerEvent: number; share: number }[];
  /** The library's costliest functions by self time. */
  topLibraryFunctions: { name: string; usPerEvent: number }[];
}

const IDLE = new Set(['(idle)']);

/** The group a frame's self time is charged to. */
export function groupOf(url: string, functionName: string): string {
  if (functionName === '(garbage collector)') return 'GC';
  if (functionName === '(program)') return 'V8 (program)';
  if (url.includes('/dist/lib/')) return 'library (dist/lib)';
  if (url.includes('/dist/bench/')) return 'bench app (handlers, counters)';
  const module = /\/node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(url)?.[1];
  if (module) {
    if (module.startsWith('@nestjs/')) return '@nestjs/*';
    if (/^(pg|pg-.*|postgres-.*)$/.test(module)) return 'pg (driver)';
    if (['typeorm', 'rxjs', 'prom-client', 'reflect-metadata'].includes(module)) return module;
    return 'HTTP framework and other packages';
  }
  if (url.startsWith('node:')) return 'Node.js core';
  return 'V8/Node builtins (no source)';
}

/**
 * Charges every sample's duration to the frame on top of the stack (self time), groups frames by
 * where their code lives, and divides by the deliveries answered while the profile ran.
 */
export function attributeCpu(profile: CpuProfile, events: number): CpuAttribution {
  const byId = new Map(profile.nodes.map((node) => [node.id, node]));
  const parent = new Map<number, number>();
  for (const node of profile.nodes) for (const child of node.children ?? []) parent.set(child, node.id);
  const underLibrary = new Map<number, boolean>();
  const hasLibraryFrame = (id: number): boolean => {
    const known = underLibrary.get(id);
    if (known !== undefined) return known;
    const node = byId.get(id)!;
    const up = parent.get(id);
    const result = node.callFrame.url.includes('/dist/lib/') || (up !== undefined && hasLibraryFrame(up));
    underLibrary.set(id, result);
    return result;
  };

  const groups = new Map<string, number>();
  const libraryFunctions = new Map<string, number>();
  let busyUs = 0;
  let inclusiveUs = 0;
  for (let i = 0; i < profile.samples.length; i++) {
    // A sample lasts until the next one; the last gets the previous interval.
    const us = profile.timeDeltas[i + 1] ?? profile.timeDeltas[i] ?? 0;
    const node = byId.get(profile.samples[i])!;
    const { functionName, url, lineNumber } = node.callFrame;
    if (IDLE.has(functionName)) continue;
    busyUs += us;
    const group = groupOf(url, functionName);
    groups.set(group, (groups.get(group) ?? 0) + us);
    if (group === 'library (dist/lib)') {
      const name = `${functionName || '(anonymous)'} ${url.split('/dist/lib/')[1]}:${lineNumber + 1}`;
      libraryFunctions.set(name, (libraryFunctions.get(name) ?? 0) + us);
    }
    if (hasLibraryFrame(node.id)) inclusiveUs += us;
  }
  const perEvent = (us: number) => round(us / Math.max(events, 1), 1);
  const share = (us: number) => round(us / Math.max(busyUs, 1), 4);
  const libraryUs = groups.get('library (dist/lib)') ?? 0;
  return {
    events,
    cpuUsPerEvent: perEvent(busyUs),
    libraryUsPerEvent: perEvent(libraryUs),
    libraryShare: share(libraryUs),
    libraryInclusiveUsPerEvent: perEvent(inclusiveUs),
    libraryInclusiveShare: share(inclusiveUs),
    groups: [...groups]
      .sort((a, b) => b[1] - a[1])
      .map(([group, us]) => ({ group, usPerEvent: perEvent(us), share: share(us) })),
    topLibraryFunctions: [...libraryFunctions]
      .sort((a, b) => b[1] - a[1])
      .slice(0, 8)
      .map(([name, us]) => ({ name, usPerEvent: perEvent(us) })),
  };
}
