import type { CpuProfile } from './cpu-attribution.js';
import { groupOf } from './cpu-attribution.js';

/** Width of the picture, in pixels; a frame narrower than MIN_WIDTH is left out. */
const WIDTH = 1200;
const FRAME_HEIGHT = 17;
const MIN_WIDTH = 0.4;
/** A frame wide enough for this many pixels gets its name written in it. */
const LABEL_MIN_WIDTH = 36;
const CHAR_WIDTH = 6.6;

/** Colours by where the code lives, as cpu-attribution.ts groups it: the library stands out. */
const COLOURS: Record<string, string> = {
  'library (dist/lib)': '#e8743b',
  '@nestjs/*': '#5bb974',
  typeorm: '#4e8bd6',
  'pg (driver)': '#9b6fd0',
  rxjs: '#d6b23a',
  'HTTP framework and other packages': '#8fb8c9',
  'Node.js core': '#a9a9a9',
  'bench app (handlers, counters)': '#c9a0a0',
  GC: '#555555',
};

/** One frame of the picture: a call path, its own time and its children's. */
interface Frame {
  name: string;
  where: string;
  group: string;
  selfUs: number;
  totalUs: number;
  children: Frame[];
}

/** XML text: the names of functions and files can hold `<`, `&` and quotes. */
function xml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
}

/**
 * A flame graph of a V8 `.cpuprofile` as an SVG picture: each call path a box as wide as the time
 * spent in it and in what it called, callers below callees, idle time left out, coloured by where
 * the code lives (the library orange). Times are per event (`events` deliveries answered while the
 * profile ran), in each box's tooltip. Self-contained: no script, readable in any browser and in
 * a GitHub file view.
 */
export function renderFlameGraph(profile: CpuProfile, events: number, title: string): string {
  const nodes = new Map(profile.nodes.map((node) => [node.id, node]));
  const self = new Map<number, number>();
  for (let i = 0; i < profile.samples.length; i++) {
    const us = profile.timeDeltas[i + 1] ?? profile.timeDeltas[i] ?? 0;
    self.set(profile.samples[i], (self.get(profile.samples[i]) ?? 0) + us);
  }
  const build = (id: number): Frame | undefined => {
    const node = nodes.get(id)!;
    const { functionName, url, lineNumber } = node.callFrame;
    if (functionName === '(idle)') return undefined;
    const children = (node.children ?? []).map(build).filter((frame): frame is Frame => frame !== undefined);
    const selfUs = self.get(id) ?? 0;
    const totalUs = selfUs + children.reduce((sum, child) => sum + child.totalUs, 0);
    const file = url ? url.replace(/^.*\/(node_modules|dist)\//, '$1/') : '';
    return {
      name: functionName || '(anonymous)',
      where: file ? `${file}:${lineNumber + 1}` : '',
      group: groupOf(url, functionName),
      selfUs,
      totalUs,
      children: children.sort((a, b) => a.name.localeCompare(b.name)),
    };
  };
  const root = build(profile.nodes[0].id);
  const totalUs = root?.totalUs ?? 0;
  const perEvent = (us: number) => (us / Math.max(events, 1)).toFixed(1);
  const boxes: string[] = [];
  let depth = 0;
  const place = (frame: Frame, x: number, level: number) => {
    const width = (frame.totalUs / Math.max(totalUs, 1)) * WIDTH;
    if (width < MIN_WIDTH) return;
    depth = Math.max(depth, level);
    boxes.push(box(frame, x, level, width));
    let childX = x;
    for (const child of frame.children) {
      place(child, childX, level + 1);
      childX += (child.totalUs / Math.max(totalUs, 1)) * WIDTH;
    }
  };
  const box = (frame: Frame, x: number, level: number, width: number) => {
    const share = ((frame.totalUs / Math.max(totalUs, 1)) * 100).toFixed(1);
    const tip =
      `${frame.name} ${frame.where}\n${perEvent(frame.totalUs)} µs/event with callees (${share}%), ` +
      `${perEvent(frame.selfUs)} µs/event self`;
    const label =
      width >= LABEL_MIN_WIDTH ? frame.name.slice(0, Math.floor((width - 6) / CHAR_WIDTH)) : undefined;
    // Drawn bottom-up; the y is fixed once the depth is known.
    return `<g data-level="${level}"><title>${xml(tip)}</title><rect x="${x.toFixed(2)}" y="LEVEL${level}" width="${width.toFixed(2)}" height="${FRAME_HEIGHT - 1}" fill="${COLOURS[frame.group] ?? '#cccccc'}" rx="2"/>${
      label ? `<text x="${(x + 3).toFixed(2)}" y="TEXT${level}">${xml(label)}</text>` : ''
    }</g>`;
  };
  if (root) for (const child of root.children) place(child, placeX(root, child, totalUs), 0);
  const height = (depth + 1) * FRAME_HEIGHT + 60;
  const y = (level: number) => height - 20 - (level + 1) * FRAME_HEIGHT;
  const body = boxes
    .map((svg) =>
      svg
        .replace(/LEVEL(\d+)/, (_, level: string) => String(y(Number(level))))
        .replace(/TEXT(\d+)/, (_, level: string) => String(y(Number(level)) + FRAME_HEIGHT - 5)),
    )
    .join('\n');
  let legendX = 10;
  const legend = Object.entries(COLOURS)
    .map(([group, colour]) => {
      const name = group.replace(/ \(.*\)$/, '');
      const entry =
        `<rect x="${legendX}" y="${height - 14}" width="10" height="10" fill="${colour}"/>` +
        `<text x="${legendX + 14}" y="${height - 5}">${xml(name)}</text>`;
      legendX += 14 + name.length * CHAR_WIDTH + 16;
      return entry;
    })
    .join('');
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${WIDTH}" height="${height}" viewBox="0 0 ${WIDTH} ${height}" font-family="Verdana, sans-serif" font-size="11">`,
    `<rect width="100%" height="100%" fill="#fcfcf5"/>`,
    `<text x="${WIDTH / 2}" y="18" text-anchor="middle" font-size="15">${xml(title)}</text>`,
    `<text x="${WIDTH / 2}" y="34" text-anchor="middle" fill="#555">${perEvent(totalUs)} µs of CPU per event (idle left out); hover a box for its time</text>`,
    body,
    legend,
    '</svg>',
    '',
  ].join('\n');
}

/** Where a top-level frame starts: after the frames before it under the root. */
function placeX(root: Frame, child: Frame, totalUs: number): number {
  let x = 0;
  for (const sibling of root.children) {
    if (sibling === child) break;
    x += (sibling.totalUs / Math.max(totalUs, 1)) * WIDTH;
  }
  return x;
}
