#!/usr/bin/env python
"""Build maxpost's documentation as an offline HTML site, without Quarto.

    .venv/bin/python tools/build_docs.py [--out _site] [--jobs 2] [--nbdev-exec]

Every notebook under the configured `nbs_path` (recursively; names starting with `_` or `.` are skipped) goes through
nbdev's own docs pipeline, the processors that `nbdev-docs` runs before handing the notebook to Quarto
(`nbdev.processors.FilterDefaults`: frontmatter, `add_show_docs`, `rm_export`, `hide_`, `clean_show_doc`,
`exec_show_docs`, `add_links`, ...). Exported functions and classes thus get their `show_doc` entry (signature with
the parameter comments, docstring), `#| hide` and `#| export` cells disappear, backticked names link to their entry.
The processed notebook is then rendered by nbconvert (`HTMLExporter`, lab template) and wrapped in a page with a
sidebar listing every page. The pages read offline: no script at all, CSS in `assets/`, math drawn at build time
as inline SVG by matplotlib's mathtext (TeX source kept as the tooltip; TeX it can't draw is shown as code).

No notebook is executed. Like nbdev, the build runs the exported cells and the `show_doc` calls, so that `show_doc`
can inspect live objects. Unlike nbdev, which also runs every cell that contains an import (whole, tests and model
loading included), the imports of other cells are only run, and only the import statements, if an exported or
`show_doc` cell raises NameError without them. `--nbdev-exec` restores nbdev's exact rule.
One repair to nbdev 3.3.26 / fastcore: `show_doc` of a flax NNX Module dies with NameError (see `_patch_signature`).

Output: `<out>/<notebook stem>.html` per notebook (`00_config.html`, ...; sub-folders kept), `<out>/index.html` (from
`nbs/index.ipynb` when present, else generated), `<out>/sidebar.json` (the page list), `<out>/assets/`.
Exits 1 naming the notebook and the cell when a notebook fails to process.
"""
from __future__ import annotations

import argparse, concurrent.futures as cf, html, json, multiprocessing as mp, os, re, shutil, sys, time, traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CSS_FILE = Path(__file__).resolve().parent / 'docs.css'
ASSET_SUFFIXES = {'.png', '.jpg', '.jpeg', '.gif', '.svg', '.webp', '.css', '.js', '.json', '.txt', '.csv', '.pdf'}

# ---------------------------------------------------------------------------------------------------------------
# Finding notebooks

def _skipped(rel: Path) -> bool:
    "nbdev's rule for docs: no part of the path may start with `_` or `.` (also drops .ipynb_checkpoints)"
    return any(p.startswith(('_', '.')) for p in rel.parts)

def find_notebooks(nbs: Path) -> list[Path]:
    "Notebooks under `nbs`, relative to it, index first then by path"
    res = [p.relative_to(nbs) for p in nbs.rglob('*.ipynb') if not _skipped(p.relative_to(nbs))]
    return sorted(res, key=lambda p: (p.as_posix() != 'index.ipynb', p.parent.as_posix(), p.name))

def page_of(rel: Path) -> str:
    "Site-relative page path of a notebook: stem kept, `.html`"
    return rel.with_suffix('.html').as_posix()

# ---------------------------------------------------------------------------------------------------------------
# Worker: nbdev processing, nbconvert, math, heading ids (runs in a spawned process)

def _patch_signature():
    "fastcore's show_doc asks `inspect.signature(sym, eval_str=True)` and only survives ValueError/TypeError; flax NNX "
    "modules get their metaclass's `__call__(*args: 'Any', ...)`, whose string annotations name `Any` in a module "
    "that doesn't import it, so show_doc(Decoder) dies with NameError. Fall back to unevaluated annotations."
    import inspect, fastcore.docments as fd
    if getattr(fd.signature, '_maxpost_patched', False): return
    orig = inspect.signature
    def signature(obj, *args, **kwargs):
        try: return orig(obj, *args, **kwargs)
        except NameError:
            kwargs['eval_str'] = False
            return orig(obj, *args, **kwargs)
    signature._maxpost_patched = True
    fd.signature = signature

def _make_exec_proc(nbdev_exec: bool):
    "nbdev's `exec_show_docs`, or a variant that defers the imports of cells that are not exported (see the docstring)"
    import ast
    from nbdev import processors as P
    if nbdev_exec: return P.exec_show_docs

    def _deferred_imports(cell):
        "Source of the top-level imports of a code cell that is neither exported nor a show_doc call, else None"
        if P.cell_lang(cell) != 'python' or not cell.source or cell.cell_type != 'code': return None
        if cell.directives_.keys() & {'export', 'exports', 'exporti', 'exec_doc'}: return None
        if cell.directives_.get('eval', '').lower() == 'false': return None
        trees = cell.parsed_()
        if not trees or P._show_docs(trees): return None
        imps = [t for t in trees if isinstance(t, (ast.Import, ast.ImportFrom))]
        return '\n'.join(ast.unparse(t) for t in imps) if imps else None

    class exec_show_docs(P.exec_show_docs):
        """nbdev's processor, except for cells that are neither exported nor show_doc calls: nbdev runs them whole
        when they contain an import (tests, model loading...); here only their import statements are kept, and run
        only if an exported or show_doc cell needs them (it raised NameError), then that cell is run again."""
        def begin(self):
            super().begin()
            self.pending = []

        def _fail(self, cell, src, e):
            title = getattr(self.nb, 'frontmatter_', {}).get('title', '')
            raise Exception(f"Error{' in notebook: ' + title if title else ''} in cell {cell.idx_}:\n"
                            f"{src}\n{type(e).__name__}: {e}") from e

        def __call__(self, cell):
            if not self.nb.has_docs_ or not hasattr(self, 'k'): return
            fm = getattr(self.nb, 'frontmatter_', {})
            if P.str2bool(fm.get('skip_showdoc', False)): return
            if (src := _deferred_imports(cell)) is not None: self.pending.append(src); return
            if not P._do_eval(cell): return
            self.k.cell(cell)
            if isinstance(self.k.exc, NameError) and self.pending:
                imps, self.pending = '\n'.join(self.pending), []
                self.k.run(imps)
                if self.k.exc: self._fail(cell, imps, self.k.exc)
                self.k.cell(cell)
            if self.k.exc: self._fail(cell, cell.source, self.k.exc)
    return exec_show_docs

def nbdev_process(path: Path, nbdev_exec: bool = False):
    "Run nbdev's docs processors on the notebook at `path`; returns (cells, frontmatter)"
    from fastcore.nbio import read_nb
    from nbdev.process import NBProcessor
    from nbdev.processors import FilterDefaults
    nb = read_nb(path)
    nb.path_ = str(path)  # FrontmatterProc wants it, as in nbdev.serve
    procs = [_make_exec_proc(nbdev_exec) if p.__name__ == 'exec_show_docs' else p for p in FilterDefaults().procs()]
    NBProcessor(nb=nb, procs=procs, rm_directives='quarto').process()
    return nb.cells, dict(getattr(nb, 'frontmatter_', {}) or {})

_re_qdir = re.compile(r'^\s*#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$')
_re_srclink = re.compile(r'\[source\]\(([^)\s]+)\)\{[^}]*\}')
_re_fence_open = re.compile(r'^:::+\s*\{([^}]*)\}\s*$|^:::+\s*([\w-]+)\s*$')
_re_fence_close = re.compile(r'^:::+\s*$')
_re_attrs = re.compile(r'\)\{(?:target|style|\.)[^}\n]*\}')

def _quarto_md(src: str) -> str:
    "Turn Quarto-only markdown into plain markdown/HTML: fenced divs become <div>s, link attributes go"
    out = []
    for line in src.split('\n'):
        m = _re_fence_open.match(line)
        if m:
            spec = m.group(1) or '.' + m.group(2)
            classes = ' '.join(c[1:] for c in spec.split() if c.startswith('.'))
            extra = ' callout' if 'callout-' in classes else ''
            out += ['', f'<div class="{html.escape(classes)}{extra}">', '']
        elif _re_fence_close.match(line): out += ['', '</div>', '']
        else: out.append(line)
    src = '\n'.join(out)
    src = _re_srclink.sub(lambda m: f'<a class="source-link" href="{html.escape(m.group(1))}">source</a>', src)
    return _re_attrs.sub(')', src)

def to_nbformat(cells) -> 'nbformat.NotebookNode':
    "A clean nbformat v4 notebook from nbdev's processed cells, Quarto cell options applied"
    import nbformat
    from nbformat import v4
    nb = v4.new_notebook()
    nb.metadata = {'kernelspec': {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'},
                   'language_info': {'name': 'python'}}
    for c in cells:
        if c.cell_type == 'raw': continue  # the frontmatter, rendered as the page header
        src = c.source if isinstance(c.source, str) else ''.join(c.source)
        if c.cell_type == 'markdown':
            if not re.sub(r'<!--.*?-->', '', src, flags=re.S).strip(): continue  # e.g. nbdev's "autogenerated" note
            nb.cells.append(v4.new_markdown_cell(_quarto_md(src), attachments=c.get('attachments') or None)
                            if c.get('attachments') else v4.new_markdown_cell(_quarto_md(src)))
            continue
        lines, opts = src.split('\n'), {}
        while lines and (m := _re_qdir.match(lines[0])):
            opts[m.group(1)] = m.group(2).strip('"\'').lower()
            lines.pop(0)
        if opts.get('include') == 'false': continue
        code = v4.new_code_cell('\n'.join(lines).strip('\n'))
        outputs = [] if opts.get('output') == 'false' else list(c.get('outputs', []))
        for o in outputs:
            d = o.get('data')
            if d and 'text/markdown' in d:
                md = d['text/markdown']
                d['text/markdown'] = _quarto_md(''.join(md) if isinstance(md, list) else md)
                if opts.get('output') == 'asis': d.pop('text/plain', None)  # show_doc: the markdown only
        code.outputs = [nbformat.from_dict(dict(o)) for o in outputs]
        tags = []
        if opts.get('echo') == 'false' or not code.source.strip(): tags.append('remove_input')
        if not code.outputs and 'remove_input' in tags: continue
        if tags: code.metadata['tags'] = tags
        if opts.get('output') == 'asis': code.metadata['tags'] = tags + ['asis']
        if opts.get('code-fold') in ('true', 'show'): code.metadata['code_fold'] = opts['code-fold']
        nb.cells.append(code)
    return nb

def nb_html(nb) -> tuple[str, str]:
    "nbconvert's lab rendering of `nb`: (cells HTML, the template's CSS)"
    from nbconvert import HTMLExporter
    from traitlets.config import Config
    cfg = Config()
    cfg.TagRemovePreprocessor.enabled = True
    cfg.TagRemovePreprocessor.remove_input_tags = {'remove_input'}
    cfg.TagRemovePreprocessor.remove_cell_tags = {'remove_cell'}
    ex = HTMLExporter(config=cfg, template_name='lab')
    ex.exclude_input_prompt = ex.exclude_output_prompt = True
    ex.anchor_link_text = '#'
    full, _ = ex.from_notebook_node(nb)
    css = '\n'.join(re.findall(r'<style[^>]*>(.*?)</style>', full, flags=re.S))
    m = re.search(r'<main[^>]*>(.*)</main>', full, flags=re.S) or re.search(r'<body[^>]*>(.*)</body>', full, flags=re.S)
    return m.group(1), css

# --- math ---------------------------------------------------------------------------------------------------------

_SYMS = {r'\le': r'\leq', r'\ge': r'\geq', r'\ne': r'\neq', r'\lvert': '|', r'\rvert': '|', r'\lVert': r'\Vert',
         r'\rVert': r'\Vert', r'\|': r'\Vert', r'\tfrac': r'\frac', r'\operatorname': r'\mathrm',
         r'\textrm': r'\mathrm', r'\textbf': r'\mathbf', r'\textit': r'\mathit', r'\lbrace': r'\{',
         r'\rbrace': r'\}', r'\colon': ':', r'\dots': r'\ldots', r'\cdots': r'\cdots', r'\displaystyle': '',
         r'\textstyle': '', r'\limits': '', r'\nolimits': '', r'\!': '', r'\middle': ''}
_SIZERS = re.compile(r'\\(?:big|Big|bigg|Bigg)[lrm]?(?![a-zA-Z])')
_TWO_ARGS = ('frac', 'dfrac', 'binom')
_ONE_ARG = ('mathbb', 'mathcal', 'mathrm', 'mathbf', 'mathit', 'mathsf', 'mathtt', 'mathfrak', 'text', 'sqrt',
            'hat', 'widehat', 'bar', 'overline', 'tilde', 'widetilde', 'vec', 'dot', 'ddot', 'boxed')

def _arg(s: str, i: int) -> tuple[str, int]:
    "One TeX argument of `s` at `i`: a {group}, a \\command or a character; returns (braced arg, end)"
    while i < len(s) and s[i] == ' ': i += 1
    if i >= len(s): raise ValueError('missing argument')
    if s[i] == '{':
        depth, j = 0, i
        while j < len(s):
            depth += {'{': 1, '}': -1}.get(s[j], 0)
            if s[j] == '\\': j += 1
            elif depth == 0: return s[i:j + 1], j + 1
            j += 1
        raise ValueError('unbalanced braces')
    if s[i] == '\\':
        m = re.match(r'\\([a-zA-Z]+|.)', s[i:])
        return '{' + m.group(0) + '}', i + len(m.group(0))
    return '{' + s[i] + '}', i + 1

def normalize_tex(s: str) -> str:
    "Rewrite TeX into the dialect matplotlib's mathtext parses"
    s = ' '.join(s.split())
    s = _SIZERS.sub('', s)
    s = re.sub(r'\\([a-zA-Z]+|[|!])', lambda m: _SYMS.get(m.group(0), m.group(0)), s)
    # brace single-token arguments: \frac12 -> \frac{1}{2}, \mathbb E -> \mathbb{E}
    out, i = [], 0
    cmd = re.compile(r'\\(' + '|'.join(_TWO_ARGS + _ONE_ARG) + r')(?![a-zA-Z])')
    while (m := cmd.search(s, i)):
        out.append(s[i:m.end()])
        i = m.end()
        if m.group(1) == 'sqrt' and s[i:i + 1] == '[':
            j = s.index(']', i); out.append(s[i:j + 1]); i = j + 1
        for _ in range(2 if m.group(1) in _TWO_ARGS else 1):
            a, i = _arg(s, i)
            out.append(normalize_tex(a[1:-1]).join('{}') if a.startswith('{') else a)
    out.append(s[i:])
    s = ''.join(out)
    s = re.sub(r'\\boxed\{', r'\\mathbf{', s)  # no boxes in mathtext
    return s

_ttp = _mt = None

def tex_svg(tex: str, scale: float = 1.1) -> str:
    "Inline SVG (one path, baseline aligned, currentColor) of `tex`, drawn by matplotlib's mathtext"
    global _ttp, _mt
    from matplotlib.font_manager import FontProperties
    if _ttp is None:
        from matplotlib.textpath import TextToPath
        from matplotlib.mathtext import MathTextParser
        _ttp, _mt = TextToPath(), MathTextParser('path')
    s = f'${tex}$'
    prop = FontProperties(size=_ttp.FONT_SCALE, math_fontfamily='cm')
    verts, codes = _ttp.get_text_path(prop, s, ismath=True)
    width = _mt.parse(s, 72, prop).width
    if not len(verts): return '<span class="math-space"></span>'
    ys = [v[1] for v in verts]
    ymin, ymax = min(min(ys), 0) - 8, max(ys) + 8
    width = max(width, max(v[0] for v in verts)) + 4
    d, k, n = [], 0, len(codes)
    while k < n:  # Path codes: 1 MOVETO, 2 LINETO, 3 CURVE3 (2 pts), 4 CURVE4 (3 pts), 79 CLOSEPOLY
        c = codes[k]
        f = lambda v: f'{v[0]:.1f} {-v[1]:.1f}'
        if c == 1: d.append('M' + f(verts[k])); k += 1
        elif c == 2: d.append('L' + f(verts[k])); k += 1
        elif c == 3: d.append('Q' + f(verts[k]) + ' ' + f(verts[k + 1])); k += 2
        elif c == 4: d.append('C' + ' '.join(f(verts[k + j]) for j in range(3))); k += 3
        elif c == 79: d.append('Z'); k += 1
        else: k += 1
    em = scale / _ttp.FONT_SCALE
    t = html.escape(tex, quote=True)
    return (f'<svg class="math-svg" xmlns="http://www.w3.org/2000/svg" role="img" aria-label="{t}" '
            f'viewBox="-2 {-ymax:.1f} {width:.1f} {ymax - ymin:.1f}" width="{width * em:.3f}em" '
            f'height="{(ymax - ymin) * em:.3f}em" style="vertical-align:{ymin * em:.3f}em">'
            f'<title>{t}</title><path fill="currentColor" d="{"".join(d)}"/></svg>')

def _split_top(s: str, sep: str) -> list[str]:
    "Split `s` on `sep` outside braces"
    parts, depth, cur, i = [], 0, '', 0
    while i < len(s):
        if s.startswith(sep, i) and depth == 0 and not (sep == '&' and i and s[i - 1] == '\\'):
            parts.append(cur); cur = ''; i += len(sep); continue
        if s[i] == '\\' and sep != '\\\\' and i + 1 < len(s): cur += s[i:i + 2]; i += 2; continue
        if s[i] == '\\' and sep == '\\\\' and not s.startswith('\\\\', i): cur += s[i:i + 2]; i += 2; continue
        depth += {'{': 1, '}': -1}.get(s[i], 0)
        cur += s[i]; i += 1
    return parts + [cur]

def _table(body: str, cls: str, scale: float) -> str:
    rows = [r for r in _split_top(body, '\\\\') if r.strip()]
    trs = ''.join('<tr>' + ''.join(f'<td>{tex_svg(c.strip(), scale) if c.strip() else ""}</td>'
                                    for c in _split_top(r, '&')) + '</tr>' for r in rows)
    return f'<table class="{cls}"><tbody>{trs}</tbody></table>'

def _display_fracs(s: str) -> str:
    "Outermost \\frac of a display formula in display style (mathtext's \\frac is always text style)"
    out, depth, i = [], 0, 0
    while i < len(s):
        if s.startswith('\\frac', i) and depth == 0 and not s[i + 5:i + 6].isalpha():
            out.append('\\dfrac'); i += 5; continue
        if s[i] == '\\': out.append(s[i:i + 2]); i += 2; continue
        depth += {'{': 1, '}': -1}.get(s[i], 0)
        out.append(s[i]); i += 1
    return ''.join(out)

_re_limits = re.compile(r'\\(sum|prod|coprod|bigcup|bigcap|bigoplus|bigotimes|lim|max|min|sup|inf|argmax|argmin)'
                        r'(?![a-zA-Z])\s*(?=[_^])')
_re_env = re.compile(r'\\begin\{(\w+\*?)\}(.*?)\\end\{\1\}', re.S)

def render_math(tex: str, display: bool) -> str:
    "HTML for one formula: SVG via mathtext; environments as tables; the TeX source as code if all else fails"
    scale = 1.2 if display else 1.1
    try:
        t = normalize_tex(tex)
        if not display: t = _re_limits.sub(r'\\\1{}', t)  # inline: limits beside the operator, as TeX does
        else: t = _display_fracs(t)
        m = _re_env.search(t)
        if m:
            env, body = m.group(1), m.group(2)
            pre, post = t[:m.start()].strip(), t[m.end():].strip()
            cls = 'math-cases' if env in ('cases', 'dcases') else 'math-align'
            mid = _table(body, cls, scale)
            if env.endswith('matrix'): mid = f'<span class="math-matrix">{mid}</span>'
            res = (tex_svg(pre, scale) if pre else '') + mid + (tex_svg(post, scale) if post else '')
        elif '\\\\' in t or '&' in t.replace('\\&', ''): res = _table(t, 'math-align', scale)
        else: res = tex_svg(t, scale)
        tag = 'div' if display else 'span'
        return f'<{tag} class="math {"display" if display else "inline"}">{res}</{tag}>'
    except Exception:
        cls = 'math-tex display' if display else 'math-tex'
        src = html.escape(tex.strip())
        return f'<div class="{cls}"><code>{src}</code></div>' if display else f'<code class="{cls}">{src}</code>'

_re_math = re.compile(r'\$\$(.+?)\$\$|\\\[(.+?)\\\]|\\\((.+?)\\\)|(?<![\\$])\$(?!\s)([^$]+?)(?<![\s\\])\$(?!\d)', re.S)

def render_all_math(soup) -> int:
    "Replace TeX in the rendered markdown (outside code) by drawn formulas; returns how many could not be drawn"
    from bs4 import NavigableString, BeautifulSoup
    failed = 0
    for node in list(soup.find_all(string=_re_math)):
        if not isinstance(node, NavigableString) or node.find_parent(['code', 'pre', 'script', 'style', 'svg']): continue
        if not node.find_parent(class_='jp-RenderedMarkdown'): continue
        text, out, pos = str(node), [], 0
        for m in _re_math.finditer(text):
            out.append(html.escape(text[pos:m.start()], quote=False))
            display = m.group(1) is not None or m.group(2) is not None
            tex = next(g for g in m.groups() if g is not None)
            r = render_math(tex, display)
            failed += 'math-tex' in r
            out.append(r); pos = m.end()
        out.append(html.escape(text[pos:], quote=False))
        frag = BeautifulSoup(''.join(out), 'html.parser')
        node.replace_with(*list(frag.contents))
    # a paragraph holding only a display formula: unwrap the <p> (block in inline)
    for p in soup.find_all('p'):
        kids = [k for k in p.contents if not (isinstance(k, NavigableString) and not k.strip())]
        if len(kids) == 1 and getattr(kids[0], 'name', None) == 'div': p.unwrap()
    return failed

# --- headings & links ------------------------------------------------------------------------------------------------

def slug(text: str) -> str:
    "Pandoc/Quarto's heading id: lower case, spaces to dashes, punctuation other than -_. dropped"
    s = re.sub(r'[^\w\s.-]', '', text.strip().lower())
    s = re.sub(r'\s+', '-', s)
    return s.lstrip('0123456789.-_') or 'section'

def fix_headings(soup) -> list[tuple[int, str, str]]:
    "Quarto-style heading ids (what nbdev's links point at); returns the table of contents [(level, id, text)]"
    seen, toc = set(), []
    for h in soup.find_all(['h1', 'h2', 'h3', 'h4']):
        for a in h.find_all('a', class_='anchor-link'): a.decompose()
        text = h.get_text(' ', strip=True)
        base = slug(text); hid, k = base, 1
        while hid in seen: k += 1; hid = f'{base}-{k}'
        seen.add(hid)
        h['id'] = hid
        a = soup.new_tag('a', href=f'#{hid}', attrs={'class': 'anchor-link', 'aria-hidden': 'true'})
        a.string = '#'
        h.append(a)
        api = bool(h.find_previous_sibling('a', class_='source-link') or
                   (h.parent and h.parent.find('a', class_='source-link', recursive=False)))
        toc.append((int(h.name[1]), hid, text, api))
    return toc

def rewrite_links(soup, pages: dict[str, str], doc_url: str, depth: int) -> None:
    "Links to the hosted docs (`<doc_url>config.html#x`) point at this site's page (`00_config.html#x`)"
    up = '../' * depth
    for a in soup.find_all('a', href=True):
        href = a['href']
        if not doc_url or not href.startswith(doc_url): continue
        rest = href[len(doc_url):]
        path, _, frag = rest.partition('#')
        path = path.removesuffix('.md')
        if path in pages: a['href'] = up + pages[path] + (f'#{frag}' if frag else '')

def full_description(path: Path, desc: str) -> str:
    "nbdev's frontmatter keeps only the first line of a `> description` that spans several; take the whole quote"
    try: nb = json.loads(path.read_text())
    except Exception: return desc
    md = next((c for c in nb.get('cells', []) if c.get('cell_type') == 'markdown'), None)
    if not md or not desc: return desc
    lines = ''.join(md['source']).split('\n')
    for i, l in enumerate(lines):
        if l.startswith('>') and l[1:].strip() == desc:
            quote = [l[1:].strip()]
            for l2 in lines[i + 1:]:
                if not l2.startswith('>') or not l2[1:].strip(): break
                quote.append(l2[1:].strip())
            return ' '.join(quote)
    return desc

def process_one(job: dict) -> dict:
    "Worker: one notebook to page HTML pieces; never raises (the error goes back to the parent)"
    t0 = time.time()
    src = Path(job['path'])
    res = {'rel': job['rel'], 'page': job['page']}
    try:
        os.environ.setdefault('JAX_PLATFORMS', 'cpu')
        os.environ['IN_TEST'] = '1'  # as nbdev.serve_drv
        os.chdir(src.parent)
        warnings.simplefilter('ignore')
        _patch_signature()
        from bs4 import BeautifulSoup
        cells, fm = nbdev_process(src, job['nbdev_exec'])
        body, css = nb_html(to_nbformat(cells))
        soup = BeautifulSoup(body, 'html.parser')
        res['math_failed'] = render_all_math(soup)
        for a in soup.find_all('a', class_='source-link'):
            a['target'] = '_blank'; a['rel'] = 'noopener'
            if a['href'].endswith('#LNone'): a['href'] = a['href'][:-len('#LNone')]
        res['toc'] = fix_headings(soup)
        rewrite_links(soup, job['pages'], job['doc_url'], job['page'].count('/'))
        res.update(body=str(soup), css=css, title=str(fm.get('title') or src.stem),
                   description=full_description(src, str(fm.get('description') or '')), ok=True)
    except BaseException as e:
        res.update(ok=False, error=f'{type(e).__name__}: {e}', trace=traceback.format_exc())
    res['seconds'] = round(time.time() - t0, 2)
    return res

# ---------------------------------------------------------------------------------------------------------------
# Assembling the site

def _e(s) -> str: return html.escape(str(s), quote=True)

def _inline_md(s: str) -> str:
    "Backticks to <code> in a one-line description"
    return re.sub(r'`([^`]+)`', r'<code>\1</code>', _e(s))

def nav_html(entries: list[dict], current: str) -> str:
    up = '../' * current.count('/')
    items = []
    for en in entries:
        cls = ' class="active" aria-current="page"' if en['page'] == current else ''
        items.append(f'<li{cls}><a href="{up}{_e(en["page"])}">{_e(en["title"])}</a></li>')
    return '<nav class="sidebar" aria-label="Pages"><ul>' + ''.join(items) + '</ul></nav>'

def toc_html(toc) -> str:
    rows = [(lvl, hid, txt, api) for lvl, hid, txt, api in toc if lvl in (2, 3)]
    if len(rows) < 2: return ''
    lis = ''.join(f'<li class="toc-h{lvl}{" toc-api" if api else ""}"><a href="#{_e(hid)}">{_e(txt)}</a></li>'
                  for lvl, hid, txt, api in rows)
    return f'<aside class="toc" aria-label="On this page"><p>On this page</p><ul>{lis}</ul></aside>'

def page_html(*, title, description, body, nav, toc, site_title, site_desc, page, is_index=False) -> str:
    up = '../' * page.count('/')
    desc = f'<p class="description">{_inline_md(description)}</p>' if description else ''
    head_title = site_title if is_index and title == site_title else f'{title} – {site_title}'
    return f'''<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="maxpost tools/build_docs.py (nbdev processors + nbconvert)">
<title>{_e(head_title)}</title>
<link rel="stylesheet" href="{up}assets/notebook.css">
<link rel="stylesheet" href="{up}assets/docs.css">
</head>
<body data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<header class="topbar"><a class="brand" href="{up}index.html">{_e(site_title)}</a><span class="tagline">{_inline_md(site_desc)}</span></header>
<div class="layout">
{nav}
<main class="content" id="content">
<header class="page-header"><h1 class="title">{_e(title)}</h1>{desc}</header>
<div class="jp-Notebook nb-body">
{body}
</div>
</main>
{toc}
</div>
</body>
</html>
'''

def generated_index(entries, site_title, site_desc) -> str:
    rows = ''.join(f'<li><a href="{_e(en["page"])}">{_e(en["title"])}</a>'
                   f'{" — " + _inline_md(en["description"]) if en["description"] else ""}</li>' for en in entries)
    return (f'<div class="jp-RenderedHTMLCommon generated-index"><p>{_inline_md(site_desc)}</p>'
            f'<h2 id="pages">Pages</h2><ul class="page-list">{rows}</ul></div>')

def build(out: Path, jobs: int, nbdev_exec: bool, nbs: Path | None = None) -> int:
    t0 = time.time()
    os.chdir(ROOT)
    from nbdev.config import get_config, nbpath2html
    cfg = get_config()
    nbs = Path(nbs or cfg.nbs_path).resolve()
    site_title, site_desc = cfg.get('title') or cfg.lib_name, cfg.get('description', '')
    doc_url = f"{cfg.get('doc_host', '').rstrip('/')}{cfg.get('doc_baseurl', '').rstrip('/')}/" if cfg.get('doc_host') else ''
    rels = find_notebooks(nbs)
    if not rels:
        print(f'build_docs: no notebooks under {nbs}', file=sys.stderr); return 1
    # nbdev's page names (config.html, what its links use) -> this site's (00_config.html)
    pages = {nbpath2html(r).as_posix(): page_of(r) for r in rels}
    jobs_ = [dict(path=str(nbs / r), rel=r.as_posix(), page=page_of(r), pages=pages, doc_url=doc_url,
                  nbdev_exec=nbdev_exec) for r in rels]
    print(f'build_docs: {len(rels)} notebooks from {nbs} -> {out} ({jobs} worker{"s" * (jobs > 1)})', flush=True)
    results = []
    # workers are spawned (fresh interpreters, as nbdev does) and find `process_one` by importing this file as a module
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_docs as worker_mod
    try:
        with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=mp.get_context('spawn')) as ex:
            for r in ex.map(worker_mod.process_one, jobs_):
                status = 'ok' if r['ok'] else 'FAILED'
                extra = f", {r['math_failed']} formula(s) left as TeX" if r.get('math_failed') else ''
                print(f"  {r['rel']}: {status} ({r['seconds']}s{extra})", flush=True)
                results.append(r)
    except cf.process.BrokenProcessPool as e:
        done = {r['rel'] for r in results}
        left = [j['rel'] for j in jobs_ if j['rel'] not in done]
        print(f'build_docs: FAILED: a worker process died ({e}; out of memory?) while processing one of: '
              f"{', '.join(left)}", file=sys.stderr)
        return 1
    failed = [r for r in results if not r['ok']]
    if failed:
        for r in failed:
            print(f"\nbuild_docs: FAILED to process {nbs.name}/{r['rel']}:\n{r['error']}\n{r['trace']}", file=sys.stderr)
        print(f"build_docs: {len(failed)} notebook(s) failed: {', '.join(r['rel'] for r in failed)}", file=sys.stderr)
        return 1

    out.mkdir(parents=True, exist_ok=True)
    try: old_pages = {e['page'] for e in json.loads((out / 'sidebar.json').read_text())['pages']}
    except (OSError, ValueError, KeyError, TypeError): old_pages = set()
    (out / 'assets').mkdir(exist_ok=True)
    (out / 'assets' / 'notebook.css').write_text(results[0]['css'])
    shutil.copyfile(CSS_FILE, out / 'assets' / 'docs.css')
    for f in nbs.rglob('*'):  # images and other files the notebooks refer to
        rel = f.relative_to(nbs)
        if f.is_file() and f.suffix.lower() in ASSET_SUFFIXES and not _skipped(rel):
            (out / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copyfile(f, out / rel)

    has_index = any(r['page'] == 'index.html' for r in results)
    entries = ([] if has_index else [dict(page='index.html', title='Home', description=site_desc, source=None)])
    entries += [dict(page=r['page'], title=r['title'], description=r['description'], source=f"{nbs.name}/{r['rel']}")
                for r in results]
    for r in results:
        is_index = r['page'] == 'index.html'
        (out / r['page']).parent.mkdir(parents=True, exist_ok=True)
        (out / r['page']).write_text(page_html(
            title=r['title'], description=r['description'], body=r['body'], nav=nav_html(entries, r['page']),
            toc=toc_html(r['toc']), site_title=site_title, site_desc=site_desc, page=r['page'], is_index=is_index))
    if not has_index:
        (out / 'index.html').write_text(page_html(
            title=site_title, description='', body=generated_index(entries[1:], site_title, site_desc),
            nav=nav_html(entries, 'index.html'), toc='', site_title=site_title, site_desc=site_desc,
            page='index.html', is_index=True))
    (out / 'sidebar.json').write_text(json.dumps({'title': site_title, 'pages': entries}, indent=1) + '\n')
    for stale in old_pages - {e['page'] for e in entries}:  # pages of notebooks since removed or renamed
        (out / stale).unlink(missing_ok=True)
    print(f'build_docs: wrote {len(entries)} pages to {out} in {time.time() - t0:.1f}s', flush=True)
    return 0

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default=None, help='output folder (default: _site in the repo root)')
    ap.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1), help='worker processes (default: 2)')
    ap.add_argument('--nbs', default=None, help="notebook folder (default: nbdev's nbs_path)")
    ap.add_argument('--nbdev-exec', action='store_true',
                    help="run every cell that contains an import, whole, as nbdev does (default: no test cell "
                         "runs; their imports run only if a show_doc or exported cell needs them)")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else ROOT / '_site'
    return build(out.resolve(), a.jobs, a.nbdev_exec, a.nbs and Path(a.nbs).resolve())

if __name__ == '__main__':
    sys.exit(main())
