// Render TeX with KaTeX at build time, for tools/build_docs.py.
// stdin: JSON [[tex, displayMode], ...]; stdout: JSON [{"html": ...} | {"error": ...}, ...] in the same order.
'use strict';
const katex = require('katex');
let input = '';
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => { input += d; });
process.stdin.on('end', () => {
  const out = JSON.parse(input).map(([tex, display]) => {
    try {
      return {html: katex.renderToString(tex, {displayMode: !!display, throwOnError: true, strict: false,
                                                output: 'htmlAndMathml', trust: false})};
    } catch (e) {
      return {error: String(e && e.message || e)};
    }
  });
  process.stdout.write(JSON.stringify(out));
});
