/**
 * A markdownlint rule for the one Markdown mistake no built-in rule sees: a code block opened with
 * more backticks than the line meant to close it (four, then three). CommonMark keeps the block
 * open, so the prose, headings and examples after it render as code until a long enough fence
 * comes; the README once lost a heading and an example that way. Flagged: a line inside a fenced
 * block that is itself a fence of the same character, and a block never closed at all.
 */

/** The tokens of `tokens` and all their descendants, of `type`. */
function* byType(tokens, type) {
  for (const token of tokens) {
    if (token.type === type) yield token;
    yield* byType(token.children, type);
  }
}

/** @type {import('markdownlint').Rule} */
export default {
  names: ['fence-inside-code', 'NIW001'],
  description: 'A fence inside a fenced code block, or a code block never closed',
  tags: ['code'],
  parser: 'micromark',
  function(params, onError) {
    for (const block of byType(params.parsers.micromark.tokens, 'codeFenced')) {
      const fences = block.children.filter((child) => child.type === 'codeFencedFence');
      const opening = [...byType(fences.slice(0, 1), 'codeFencedFenceSequence')][0];
      if (!opening) continue;
      for (const line of byType(block.children, 'codeFlowValue')) {
        const fence = /^(`{3,}|~{3,})/.exec(line.text.trimStart());
        if (fence && fence[1][0] === opening.text[0]) {
          onError({
            lineNumber: line.startLine,
            detail: `${fence[1]} inside the block opened with ${opening.text} at line ${block.startLine}`,
            context: line.text,
          });
        }
      }
      if (fences.length < 2 && block.endLine === params.lines.length) {
        onError({ lineNumber: block.startLine, detail: 'this code block is never closed' });
      }
    }
  },
};
