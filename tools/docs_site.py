"""Pieces of the docs site that `tools/build_docs.py` assembles: math (KaTeX), headings and links, the search index,
the page template and the assets.

Math: every `$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]` and bare `\\begin{align}…\\end{align}` (and the other math
environments) in rendered markdown is rendered at build time by KaTeX (`tools/katex_render.js`, node, the version
pinned in `tools/package-lock.json`), so pages need no script for math; KaTeX's CSS and fonts are copied to
`assets/katex/`. TeX that KaTeX cannot parse stays visible as code after a "TeX?" marker, KaTeX's message as tooltip.

Search: `search-index.js` (and the same data as `search.json`) holds one entry per page section (title, heading,
anchor, text); `assets/search.js` (from `tools/search.js`, no dependency) loads it on first use and lists matching
sections as links. A page opened with `?q=term` runs the search at once.
"""
from __future__ import annotations

import copy, html, json, re, shutil, subprocess
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
KATEX_JS = TOOLS / 'katex_render.js'
KATEX_DIR = TOOLS / 'node_modules' / 'katex'

# ---------------------------------------------------------------------------------------------------------------
# KaTeX

def ensure_katex() -> str:
    "KaTeX installed under tools/node_modules at the version of package-lock.json (runs `npm ci` if not); its version"
    want = json.loads((TOOLS / 'package-lock.json').read_text())['packages']['node_modules/katex']['version']
    pkg = KATEX_DIR / 'package.json'
    have = json.loads(pkg.read_text())['version'] if pkg.is_file() else None
    if have != want:
        if not shutil.which('npm'): raise RuntimeError('KaTeX is not installed and npm is missing (install node + npm)')
        r = subprocess.run(['npm', 'ci', '--no-audit', '--no-fund', '--loglevel=error'], cwd=TOOLS,
                           capture_output=True, text=True, timeout=600)
        if r.returncode: raise RuntimeError(f'npm ci in {TOOLS} failed:\n{r.stdout}\n{r.stderr}')
    if not shutil.which('node'): raise RuntimeError('node is needed to render math with KaTeX')
    return want

def katex(formulas: list[tuple[str, bool]]) -> list[dict]:
    "KaTeX's HTML for each (tex, display) pair: [{'html': …} or {'error': …}] (one node process for all)"
    if not formulas: return []
    r = subprocess.run(['node', str(KATEX_JS)], input=json.dumps(formulas), capture_output=True, text=True,
                       cwd=TOOLS, timeout=300)
    if r.returncode: raise RuntimeError(f'node {KATEX_JS.name} failed:\n{r.stderr[-3000:]}')
    return json.loads(r.stdout)

_ENVS = r'(?:equation|align|alignat|gather|multline|flalign|eqnarray)\*?'
_re_math = re.compile(r'\$\$(.+?)\$\$|\\\[(.+?)\\\]|(\\begin\{(' + _ENVS + r')\}.*?\\end\{\4\})|\\\((.+?)\\\)'
                      r'|(?<![\\$])\$(?!\s)([^$]+?)(?<![\s\\])\$(?!\d)', re.S)

def _unrendered(tex: str, display: bool, error: str) -> str:
    "TeX KaTeX could not parse: shown as code after a visible marker, KaTeX's message as tooltip"
    t, src = html.escape(error, quote=True), html.escape(tex.strip())
    mark = f'<span class="math-error-mark" title="{t}">TeX?</span>'
    return (f'<div class="math-error display">{mark}<code>{src}</code></div>' if display
            else f'<span class="math-error">{mark}<code>{src}</code></span>')

def render_all_math(soup) -> list[str]:
    "Replace TeX in the rendered markdown (outside code) by KaTeX's HTML; returns the TeX KaTeX could not parse"
    from bs4 import NavigableString, BeautifulSoup
    nodes = [n for n in soup.find_all(string=_re_math) if isinstance(n, NavigableString)
             and not n.find_parent(['code', 'pre', 'script', 'style', 'svg'])
             and n.find_parent(class_='jp-RenderedMarkdown')]
    found = [[(m, m.group(3) is not None or m.group(1) is not None or m.group(2) is not None)
              for m in _re_math.finditer(str(n))] for n in nodes]
    todo = [(next(g for g in (m.group(1), m.group(2), m.group(3), m.group(5), m.group(6)) if g is not None), d)
            for ms in found for m, d in ms]
    rendered, failed, k = katex(todo), [], 0
    for node, ms in zip(nodes, found):
        text, out, pos = str(node), [], 0
        for m, display in ms:
            out.append(html.escape(text[pos:m.start()], quote=False))
            (tex, _), r = todo[k], rendered[k]; k += 1
            if 'html' in r: out.append(r['html'])
            else: failed.append(tex); out.append(_unrendered(tex, display, r['error']))
            pos = m.end()
        out.append(html.escape(text[pos:], quote=False))
        node.replace_with(*list(BeautifulSoup(''.join(out), 'html.parser').contents))
    for p in soup.find_all('p'):  # a paragraph holding only a display formula: unwrap the <p> (block in inline)
        kids = [c for c in p.contents if not (isinstance(c, NavigableString) and not c.strip())]
        if len(kids) == 1 and ('katex-display' in (kids[0].get('class') or []) if kids[0].name else False): p.unwrap()
    return failed

# ---------------------------------------------------------------------------------------------------------------
# Headings, links, search sections

def slug(text: str) -> str:
    "Pandoc/Quarto's heading id: lower case, spaces to dashes, punctuation other than -_. dropped"
    s = re.sub(r'[^\w\s.-]', '', text.strip().lower())
    s = re.sub(r'\s+', '-', s)
    return s.lstrip('0123456789.-_') or 'section'

def fix_headings(soup) -> list[tuple[int, str, str, bool]]:
    "Quarto-style heading ids (what nbdev's links point at); returns the table of contents [(level, id, text, api)]"
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

def rewrite_links(soup, pages: dict[str, str], doc_url: str, page: str) -> None:
    ("Links to nbdev's page names point at this site's pages: `<doc_url>config.html#x` and a relative `config.html#x`"
     " (from a page in the site root) become `00_config.html#x`, relative to `page`")
    up = '../' * page.count('/')
    for a in soup.find_all('a', href=True):
        href = a['href']
        if doc_url and href.startswith(doc_url): rest = href[len(doc_url):]
        elif '/' not in page and not re.match(r'[a-z][a-z0-9+.-]*:|/|#|\.\./', href): rest = href
        else: continue
        path, _, frag = rest.partition('#')
        path = path.removesuffix('.md')
        if path in pages: a['href'] = up + pages[path] + (f'#{frag}' if frag else '')

_re_href = re.compile(r'href="([^"#:]*\.html)#([^"]+)"')

def repair_fragments(bodies: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    ("nbdev links a method to `page#class.method` even when only the class has an entry: point such links at the"
     " class (`page#class`). It links a private name (`_helper`) that has no entry at all: such a link becomes its"
     " text. Returns the bodies and the links repaired")
    import posixpath
    ids = {p: set(re.findall(r'\sid="([^"]+)"', b)) for p, b in bodies.items()}
    fixed = []
    def fix(page):
        def sub(m):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(page), m.group(1)))
            frag, have = m.group(2), ids.get(target)
            if have is None or frag in have or '.' not in frag: return m.group(0)
            parent = frag.rsplit('.', 1)[0]
            if parent not in have: return m.group(0)
            fixed.append(f'{page}: {m.group(1)}#{frag} -> #{parent}')
            return f'href="{m.group(1)}#{parent}"'
        return sub
    bodies = {p: _re_href.sub(fix(p), b) for p, b in bodies.items()}
    def unlink(page):        # a private name (`_helper`) has no entry: its mention stays code, not a broken link
        def sub(m):
            target = posixpath.normpath(posixpath.join(posixpath.dirname(page), m.group(1)))
            have = ids.get(target)
            if have is None or m.group(2) in have: return m.group(0)
            fixed.append(f'{page}: {m.group(1)}#{m.group(2)} -> unlinked (a private name has no entry)')
            return m.group(3)
        return sub
    return {p: _re_private.sub(unlink(p), b) for p, b in bodies.items()}, fixed

_re_private = re.compile(r'<a href="([^"#:]*\.html)#(_[^"]+)"[^>]*>(.*?)</a>', re.S)

_SEC = '\x00SEC:'

def search_sections(soup, max_chars: int = 4000) -> list[dict]:
    "The page's text cut at its headings (h1-h4): [{'anchor', 'heading', 'text'}], the text before any heading first"
    s = copy.copy(soup)
    for k in s.find_all(class_='katex'):  # math: its TeX source, not KaTeX's glyph soup
        ann = k.find('annotation')
        k.replace_with(' ' + (ann.get_text() if ann else '') + ' ')
    for t in s.find_all(['style', 'script', 'svg', 'img']): t.decompose()
    for a in s.find_all('a', class_='anchor-link'): a.decompose()
    for h in s.find_all(['h1', 'h2', 'h3', 'h4'], id=True):
        h.insert_before(f"{_SEC}{h['id']}\x00")
        h.insert_after('\x00')
    parts = s.get_text(' ').split(_SEC)
    out = []
    for i, part in enumerate(parts):
        if i == 0: anchor, heading, text = '', '', part
        else: anchor, heading, text = (part.split('\x00', 2) + ['', ''])[:3]
        text = ' '.join(text.split())[:max_chars]
        heading = ' '.join(heading.split())
        if text or heading: out.append(dict(anchor=anchor, heading=heading, text=text))
    return out

# ---------------------------------------------------------------------------------------------------------------
# Page template

def _e(s) -> str: return html.escape(str(s), quote=True)

def inline_md(s: str) -> str:
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
    desc = f'<p class="description">{inline_md(description)}</p>' if description else ''
    head_title = site_title if is_index and title == site_title else f'{title} – {site_title}'
    return f'''<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="maxpost tools/build_docs.py (nbdev processors + nbconvert + KaTeX)">
<title>{_e(head_title)}</title>
<link rel="stylesheet" href="{up}assets/notebook.css">
<link rel="stylesheet" href="{up}assets/katex/katex.min.css">
<link rel="stylesheet" href="{up}assets/docs.css">
<script src="{up}assets/search.js" data-root="{up}" defer></script>
</head>
<body data-jp-theme-light="true" data-jp-theme-name="JupyterLab Light">
<header class="topbar"><a class="brand" href="{up}index.html">{_e(site_title)}</a><span class="tagline">{inline_md(site_desc)}</span>
<form class="search" role="search" action="{up}index.html" method="get"><input type="search" name="q" id="search-input" placeholder="Search the docs" aria-label="Search the docs" autocomplete="off"><ol id="search-results" hidden></ol></form></header>
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

def generated_index(entries, site_desc) -> str:
    rows = ''.join(f'<li><a href="{_e(en["page"])}">{_e(en["title"])}</a>'
                   f'{" — " + inline_md(en["description"]) if en["description"] else ""}</li>' for en in entries)
    return (f'<div class="jp-RenderedHTMLCommon generated-index"><p>{inline_md(site_desc)}</p>'
            f'<h2 id="pages">Pages</h2><ul class="page-list">{rows}</ul></div>')

# ---------------------------------------------------------------------------------------------------------------
# Assets

def write_assets(out: Path, notebook_css: str, search_entries: list[dict]) -> None:
    "CSS, KaTeX's CSS and fonts, the search script and its index, under `out/assets/`"
    a = out / 'assets'
    a.mkdir(parents=True, exist_ok=True)
    (a / 'notebook.css').write_text(notebook_css)
    shutil.copyfile(TOOLS / 'docs.css', a / 'docs.css')
    shutil.copyfile(TOOLS / 'search.js', a / 'search.js')
    k = a / 'katex'
    if k.exists(): shutil.rmtree(k)
    k.mkdir()
    shutil.copyfile(KATEX_DIR / 'dist' / 'katex.min.css', k / 'katex.min.css')
    shutil.copytree(KATEX_DIR / 'dist' / 'fonts', k / 'fonts')
    shutil.copyfile(KATEX_DIR / 'LICENSE', k / 'LICENSE')
    data = json.dumps(search_entries, ensure_ascii=False, separators=(',', ':'))
    (a / 'search.json').write_text(data + '\n')
    # a script, not JSON: pages opened from file:// cannot fetch() a file
    (a / 'search-index.js').write_text(f'window.maxpostSearchIndex = {data};\n')
