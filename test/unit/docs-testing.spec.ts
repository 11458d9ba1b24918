import { readFileSync } from 'node:fs';
import { describe, expect, it } from '@jest/globals';
import { ExactlyOnceError, expectOneEffect } from '../../lib/testing/index.js';

const PAGE = 'docs/testing.md';
const EXAMPLES = 'test/examples/testing/';

/** A code block of the page, with the example it says it shows. */
interface Block {
  language: string;
  code: string;
  example?: string;
}

function blocks(markdown: string): Block[] {
  const found: Block[] = [];
  const fence = /(?:<!-- example: (\S+) -->\s*)?```(\w*)\n([\s\S]*?)\n```/g;
  for (const match of markdown.matchAll(fence)) {
    found.push({ example: match[1], language: match[2], code: match[3] });
  }
  return found;
}

/** The example file, or one `// #region` of it, as a user would import the package. */
function exampleText(example: string): string {
  const [file, region] = example.split('#');
  let text = readFileSync(`${EXAMPLES}${file}`, 'utf8');
  if (region) {
    const match = new RegExp(`// #region ${region}\\n([\\s\\S]*?)\\n\\s*// #endregion`).exec(text);
    if (!match) throw new Error(`${example}: no region ${region}`);
    text = match[1];
  }
  return text
    .replaceAll("'../../../lib/testing/index.js'", "'nest-idempotent-webhooks/testing'")
    .replaceAll("'../../../lib/index.js'", "'nest-idempotent-webhooks'");
}

/** Fenced block languages that are TypeScript, as test/support/doc-blocks.ts has them. */
const TYPESCRIPT = new Set(['ts', 'typescript']);

/** Code as tokens: Prettier wraps the page's blocks and the files at different widths. */
const tokens = (code: string) => code.replace(/,(\s*[)\]}])/g, '$1').replace(/\s+/g, '');

/**
 * docs/testing.md shows only code that compiles and runs: each TypeScript block is a file (or a
 * region of one) under test/examples/testing/, which the type-check compiles and
 * test/e2e/docs-testing-example.e2e-spec.ts runs. Its other blocks are labeled too (markdownlint
 * wants a language on every fence); the one `text` block is a failure message, and it is the one
 * the helper gives.
 */
describe(PAGE, () => {
  const page = blocks(readFileSync(PAGE, 'utf8'));
  const code = page.filter((block) => TYPESCRIPT.has(block.language));

  it('marks every code block with the example it shows', () => {
    expect(code.length).toBeGreaterThanOrEqual(8);
    expect(code.filter((block) => !block.example).map((block) => block.code.slice(0, 80))).toEqual([]);
  });

  it('shows a signed delivery on Fastify, and strictTransactions for what a test runner may not show', () => {
    expect(code.map((block) => block.example)).toEqual(
      expect.arrayContaining(['signed-delivery.ts', 'fastify-stripe.example.ts']),
    );
    const fastify = code.find((block) => block.example === 'fastify-stripe.example.ts')!.code;
    expect(fastify).toContain('new FastifyAdapter()');
    expect(fastify).toContain('strictTransactions: true');
  });

  it.each(code.filter((block) => block.example).map((block) => [block.example!, block] as const))(
    'shows %s as it is',
    (example, block) => {
      expect(tokens(block.code)).toBe(tokens(exampleText(example)));
    },
  );

  it("shows expectOneEffect's failure for a redelivery that did the work again, word for word", async () => {
    const shown = page.filter((block) => block.language === 'text').map((block) => block.code);
    expect(shown).toHaveLength(1);
    // A handler with no claim at all: every delivery does the work, so the redelivery counts 2.
    let effects = 0;
    const failure = await expectOneEffect({
      concurrent: 1,
      deliver: async () => {
        effects++;
        return { status: 200 };
      },
      effect: () => effects,
    }).catch((error: unknown) => error);
    expect(failure).toBeInstanceOf(ExactlyOnceError);
    expect((failure as ExactlyOnceError).message).toBe(shown[0]);
  });
});
