import { mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

/**
 * The TypeScript blocks of the README and docs/, taken out so that a real app's compiler checks
 * them (test/packaging/*.e2e-spec.ts), and the install lines the packaging tests run. A sample
 * that no longer compiles, or a fence that swallows the prose after it, fails the test instead of
 * reaching a reader.
 *
 * Markers are HTML comments (invisible on GitHub and npm) before a fence, with only blank lines
 * between:
 * - `<!-- doc-block: esm-only -->`: the block applies to an ES-module app only (it is not checked
 *   in the CommonJS Nest 11 app);
 * - `<!-- doc-block: file=order.entity.ts -->`: the block is written under that name, so other
 *   blocks can import it (`./order.entity.js`), as a reader's own files would be;
 * - `<!-- install: nest11-commonjs -->` before a `bash` block: its `npm install` lines are what
 *   that app installs (the packaging tests run them);
 * - `<!-- example: <file>#<region> -->`: the block is a copy of an example file (or a region of
 *   one) that a test of its own compiles, runs and compares with the page; it is left out here, as
 *   a region is a fragment, not a module.
 */

/** One TypeScript block of a Markdown file. */
export interface DocBlock {
  /** The Markdown file, as given to `extractDocBlocks`. */
  file: string;
  /** 1-based line of the opening fence. */
  line: number;
  /** The code, without the fence and without the fence's indentation. */
  code: string;
  /** Marked `esm-only`: not checked in a CommonJS app. */
  esmOnly: boolean;
  /** Marked `file=<name>`: written under this name. */
  name?: string;
}

/** A Markdown file the extractor cannot trust: a broken fence, a marker it does not know. */
export class DocBlockError extends Error {}

/** Fenced block languages that are TypeScript. */
const TYPESCRIPT = new Set(['ts', 'typescript']);
/** An opening fence (CommonMark: three or more backticks or tildes; any indentation, for list items). */
const FENCE = /^(\s*)(`{3,}|~{3,})(.*)$/;
const MARKER = /^\s*<!--\s*(doc-block|install|example):(.*?)-->\s*$/;

/** One fenced block, whatever its language, with the marker before it. */
interface Fence {
  line: number;
  info: string;
  lines: string[];
  marker?: { kind: string; value: string; line: number };
}

/**
 * Every fenced block of `markdown`. Refuses, naming the lines: a fence never closed; and a line
 * inside a block that is itself a fence of the same character (three backticks inside a block
 * opened with four): that is a block closed with the wrong length, which swallows the prose and
 * headings after it into code (the README once lost a heading and an example that way).
 */
function fences(markdown: string, file: string): Fence[] {
  const lines = markdown.split('\n');
  const found: Fence[] = [];
  let marker: Fence['marker'];
  for (let index = 0; index < lines.length; index++) {
    const text = lines[index];
    const markerMatch = MARKER.exec(text);
    if (markerMatch) {
      if (marker) throw new DocBlockError(`${file}:${index + 1}: two markers before one fence`);
      marker = { kind: markerMatch[1], value: markerMatch[2].trim(), line: index + 1 };
      continue;
    }
    const open = FENCE.exec(text);
    if (!open) {
      if (marker && text.trim() !== '')
        throw new DocBlockError(`${file}:${marker.line}: a ${marker.kind} marker not followed by a fence`);
      continue;
    }
    const [, indent, fence, info] = open;
    if (fence[0] === '`' && info.includes('`'))
      throw new DocBlockError(`${file}:${index + 1}: a backtick fence's info string holds a backtick`);
    const block: Fence = { line: index + 1, info: info.trim(), lines: [], marker };
    marker = undefined;
    let closed = false;
    for (index++; index < lines.length; index++) {
      const inner = FENCE.exec(lines[index]);
      if (inner && inner[2][0] === fence[0]) {
        if (inner[2].length >= fence.length && inner[3].trim() === '') {
          closed = true;
          break;
        }
        throw new DocBlockError(
          `${file}:${index + 1}: a fence (${inner[2]}) inside the block opened with ${fence} at line ` +
            `${block.line}: close each block with the fence it was opened with`,
        );
      }
      block.lines.push(lines[index].startsWith(indent) ? lines[index].slice(indent.length) : lines[index]);
    }
    if (!closed) throw new DocBlockError(`${file}:${block.line}: the block opened here is never closed`);
    found.push(block);
  }
  if (marker)
    throw new DocBlockError(`${file}:${marker.line}: a ${marker.kind} marker not followed by a fence`);
  return found;
}

/** A block must be a module (an import or an export), or it would share one scope with the others. */
const MODULE_STATEMENT = /^(import|export)\s/m;

/**
 * The TypeScript blocks of `markdown` (`file` names it in errors). Throws DocBlockError for a
 * broken fence, a marker it does not know, or a block that is not a complete module: every block
 * is meant to be pasted into a file as it stands, its imports included.
 */
export function extractDocBlocks(markdown: string, file: string): DocBlock[] {
  const blocks: DocBlock[] = [];
  for (const fence of fences(markdown, file)) {
    const typescript = TYPESCRIPT.has(fence.info.split(/\s+/)[0]);
    const { marker } = fence;
    if (marker?.kind === 'install' || marker?.kind === 'example') continue;
    if (marker && !typescript)
      throw new DocBlockError(
        `${file}:${marker.line}: a doc-block marker before a ${fence.info || 'plain'} block`,
      );
    if (!typescript) continue;
    const block: DocBlock = { file, line: fence.line, code: fence.lines.join('\n') + '\n', esmOnly: false };
    for (const word of marker ? marker.value.split(/\s+/) : []) {
      if (word === 'esm-only') block.esmOnly = true;
      else if (/^file=[\w.-]+\.ts$/.test(word)) block.name = word.slice('file='.length);
      else throw new DocBlockError(`${file}:${marker!.line}: unknown doc-block marker '${word}'`);
    }
    if (!MODULE_STATEMENT.test(block.code))
      throw new DocBlockError(
        `${file}:${fence.line}: a TypeScript block with no import or export: write it as a complete module`,
      );
    blocks.push(block);
  }
  return blocks;
}

/**
 * The packages the `<!-- install: <app> -->` block of `markdown` installs: every argument of its
 * `npm install` lines but the options, for each app named. A marked block with no `npm install`
 * line is refused.
 */
export function extractInstallLines(markdown: string, file: string): Map<string, string[]> {
  const installs = new Map<string, string[]>();
  for (const fence of fences(markdown, file)) {
    if (fence.marker?.kind !== 'install') continue;
    const packages = fence.lines
      .map((line) => line.replace(/#.*$/, '').trim())
      .filter((line) => line.startsWith('npm install '))
      .flatMap((line) => line.slice('npm install '.length).split(/\s+/))
      .filter((word) => word !== '' && !word.startsWith('-'));
    if (packages.length === 0)
      throw new DocBlockError(`${file}:${fence.line}: an install block without an npm install line`);
    for (const app of fence.marker.value.split(/\s+/))
      installs.set(app, [...(installs.get(app) ?? []), ...packages]);
  }
  return installs;
}

/** Where each block was written, to read the compiler's output in Markdown terms. */
export interface WrittenBlocks {
  /** The tsconfig that checks them, relative to the app. */
  tsconfig: string;
  /** Written file (relative to the app) → the Markdown file its lines are from. */
  sources: Map<string, string>;
}

/** The folder, inside the app, the blocks are written to. */
const BLOCKS_DIR = 'doc-blocks';

/**
 * Writes `blocks` into `appDir/doc-blocks/` (emptied first) and a tsconfig that checks them with the app's own
 * (`extendsConfig`, e.g. `./tsconfig.json`) plus `strict`. Each file keeps its block's Markdown
 * line numbers (the code starts on the line after its fence), so a compiler error's line is the
 * README's line. A block named `file=` is written under that name; the others as
 * `<markdown path>-L<line>.ts`.
 */
export async function writeDocBlocks(
  appDir: string,
  blocks: DocBlock[],
  extendsConfig: string,
): Promise<WrittenBlocks> {
  const dir = join(appDir, BLOCKS_DIR);
  // Only this call's blocks: a block left from an earlier call would be checked again.
  await rm(dir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  const sources = new Map<string, string>();
  for (const block of blocks) {
    const name = block.name ?? `${block.file.replace(/[/\\]/g, '-')}-L${block.line}.ts`;
    const path = join(BLOCKS_DIR, name);
    if (sources.has(path))
      throw new DocBlockError(`${block.file}:${block.line}: a second block named ${name}`);
    sources.set(path, block.file);
    await writeFile(join(appDir, path), '\n'.repeat(block.line) + block.code);
  }
  const tsconfig = 'tsconfig.doc-blocks.json';
  const config = {
    extends: extendsConfig,
    compilerOptions: { strict: true, noEmit: true, incremental: false },
    include: [`${BLOCKS_DIR}/*.ts`],
  };
  await writeFile(join(appDir, tsconfig), JSON.stringify(config, null, 2) + '\n');
  return { tsconfig, sources };
}

/**
 * The compiler's output with each written file replaced by the Markdown file it came from, so
 * `doc-blocks/README.md-L12.ts(14,3)` reads `README.md(14,3)`, and so does a `file=` block's.
 */
export function inMarkdownTerms(output: string, written: WrittenBlocks): string {
  let text = output;
  for (const [path, shown] of written.sources) text = text.split(path).join(shown);
  return text;
}

/** The package itself: the packaging tests install it from the packed tarball, not the registry. */
const THIS_PACKAGE = 'nest-idempotent-webhooks';

/** What the README and docs/ hold for the packaging tests. */
export interface Documentation {
  /** Every TypeScript block, README first, then docs/ by file name. */
  blocks: DocBlock[];
  /** App (`nest11-commonjs`, `nest12-esm`) → the packages its install blocks add, this one left out. */
  installs: Map<string, string[]>;
}

/** Reads README.md and docs/*.md under `root` (the checkout) as the packaging tests check them. */
export async function readDocumentation(root: string): Promise<Documentation> {
  const pages = (await readdir(join(root, 'docs'))).filter((name) => name.endsWith('.md')).sort();
  const files = ['README.md', ...pages.map((name) => `docs/${name}`)];
  const documentation: Documentation = { blocks: [], installs: new Map() };
  for (const file of files) {
    const markdown = await readFile(join(root, file), 'utf8');
    documentation.blocks.push(...extractDocBlocks(markdown, file));
    for (const [app, packages] of extractInstallLines(markdown, file)) {
      const others = packages.filter((name) => name !== THIS_PACKAGE);
      documentation.installs.set(app, [...(documentation.installs.get(app) ?? []), ...others]);
    }
  }
  return documentation;
}
