import { describe, expect, it } from '@jest/globals';
import { DocBlockError, extractDocBlocks, extractInstallLines } from '../support/doc-blocks.js';

/**
 * How Markdown's code blocks are read: fences, names, install lines. Pure, so it runs in
 * `npm run test:unit`; the compiler half, which type-checks blocks against the build, is
 * test/packaging/doc-blocks-typecheck.spec.ts.
 */

/** Lines of a fixture Markdown file; `FENCE` keeps the fixtures' own fences out of this file's. */
const FENCE = '```';
const md = (...lines: string[]) => lines.join('\n') + '\n';

describe('doc blocks: extraction', () => {
  it('refuses the broken fence the README once had: four backticks opened, three after the block', () => {
    // The README's BullMQ backoff example: opened with four backticks, "closed" by a three-backtick
    // line, so the paragraph, the heading and the example after it became one code block.
    const broken = md(
      'A custom strategy can ask the error:',
      '',
      '`' + FENCE + 'ts',
      "import { Processor } from '@nestjs/bullmq';",
      FENCE + ' `@Idempotent` keeps the method name.',
      '',
      '### A microservice handler',
      '',
      FENCE + 'ts',
      "import { Controller } from '@nestjs/common';",
      FENCE,
      '`' + FENCE,
    );
    expect(() => extractDocBlocks(broken, 'README.md')).toThrow(DocBlockError);
    expect(() => extractDocBlocks(broken, 'README.md')).toThrow(
      /^README\.md:5: a fence \(```\) inside the block opened with ```` at line 3/,
    );
  });

  it('refuses a block that is never closed, naming the line it opens on', () => {
    const open = md(
      '# Title',
      '',
      FENCE + 'ts',
      "import { Module } from '@nestjs/common';",
      '',
      'More prose.',
    );
    expect(() => extractDocBlocks(open, 'docs/a.md')).toThrow(
      'docs/a.md:3: the block opened here is never closed',
    );
  });

  it('refuses a TypeScript fragment: every block is a module a reader can paste, imports included', () => {
    const fragment = md(FENCE + 'ts', 'IdempotencyModule.forRoot({ leaseMs: 60_000 });', FENCE);
    expect(() => extractDocBlocks(fragment, 'docs/b.md')).toThrow(
      'docs/b.md:1: a TypeScript block with no import or export: write it as a complete module',
    );
  });

  it('refuses a marker it does not know, and one with no fence after it', () => {
    const typo = md('<!-- doc-block: esm-onyl -->', '', FENCE + 'ts', 'export {};', FENCE);
    expect(() => extractDocBlocks(typo, 'c.md')).toThrow("c.md:1: unknown doc-block marker 'esm-onyl'");
    const stray = md('<!-- doc-block: esm-only -->', '', 'Prose, not a fence.');
    expect(() => extractDocBlocks(stray, 'c.md')).toThrow(
      'c.md:1: a doc-block marker not followed by a fence',
    );
  });

  it('takes ts and typescript blocks (indented ones in list items too) with their markers, and nothing else', () => {
    const doc = md(
      '# Page',
      '',
      FENCE + 'bash',
      'npm test',
      FENCE,
      '',
      '<!-- doc-block: esm-only file=order.entity.ts -->',
      '',
      FENCE + 'ts',
      'export class Order {}',
      FENCE,
      '',
      '- An item:',
      '',
      '  ' + FENCE + 'typescript',
      "  import { Order } from './order.entity.js';",
      '  export const order = new Order();',
      '  ' + FENCE,
      '',
      '~~~ts',
      'export const tilde = 1;',
      '~~~',
    );
    expect(extractDocBlocks(doc, 'docs/page.md')).toEqual([
      {
        file: 'docs/page.md',
        line: 9,
        code: 'export class Order {}\n',
        esmOnly: true,
        name: 'order.entity.ts',
      },
      {
        file: 'docs/page.md',
        line: 15,
        code: "import { Order } from './order.entity.js';\nexport const order = new Order();\n",
        esmOnly: false,
      },
      { file: 'docs/page.md', line: 20, code: 'export const tilde = 1;\n', esmOnly: false },
    ]);
  });

  it('leaves out a block marked as a copy of an example file, which its own test checks', () => {
    const doc = md(
      '<!-- example: snippets.example.ts#rpc -->',
      '',
      FENCE + 'ts',
      'await expectOneEffect({ deliver, effect });',
      FENCE,
      '',
      FENCE + 'ts',
      'export const checked = true;',
      FENCE,
    );
    expect(extractDocBlocks(doc, 'docs/testing.md')).toEqual([
      { file: 'docs/testing.md', line: 7, code: 'export const checked = true;\n', esmOnly: false },
    ]);
  });

  it('reads the packages of marked install blocks, per app, without options or comments', () => {
    const doc = md(
      '<!-- install: nest12-esm -->',
      '',
      FENCE + 'bash',
      'npm install nest-idempotent-webhooks @nestjs/typeorm typeorm pg # Nest 12',
      FENCE,
      '',
      '<!-- install: nest11-commonjs -->',
      FENCE + 'bash',
      'npm install --save nest-idempotent-webhooks @nestjs/typeorm@^11 typeorm@^0.3',
      'npm install @nestjs/schedule@^6',
      FENCE,
    );
    expect(extractInstallLines(doc, 'README.md')).toEqual(
      new Map([
        ['nest12-esm', ['nest-idempotent-webhooks', '@nestjs/typeorm', 'typeorm', 'pg']],
        [
          'nest11-commonjs',
          ['nest-idempotent-webhooks', '@nestjs/typeorm@^11', 'typeorm@^0.3', '@nestjs/schedule@^6'],
        ],
      ]),
    );
    expect(extractDocBlocks(doc, 'README.md')).toEqual([]);
  });
});
