#!/usr/bin/env python
"""Build maxpost's documentation as an offline HTML site, without Quarto.

    .venv/bin/python tools/build_docs.py [--out _site] [--jobs 2] [--execute 'tutorials/*'] [--cell-timeout 1200]
                                         [--nbs nbs] [--nbdev-exec]

Every notebook under the configured `nbs_path` (recursively; names starting with `_` or `.` are skipped) goes through
nbdev's own docs pipeline, the processors that `nbdev-docs` runs before handing the notebook to Quarto
(`nbdev.processors.FilterDefaults`: frontmatter, `add_show_docs`, `rm_export`, `hide_`, `clean_show_doc`,
`exec_show_docs`, `add_links`, ...). Exported functions and classes thus get their `show_doc` entry (signature with
the parameter comments, docstring), `#| hide` and `#| export` cells disappear, backticked names link to their entry.
The processed notebook is then rendered by nbconvert (`HTMLExporter`, lab template) and wrapped in a page with a
sidebar listing every page, a search box and a table of contents (`tools/docs_site.py`).

Outputs: the outputs a notebook carries are shown (text, tables, images; images are embedded as data: URIs). The
notebooks matching `--execute` (glob on the path under nbs/, default `tutorials/*`; several separated by commas; ''
for none) are first run top to bottom by nbclient in this Python's kernel (JAX on CPU, `--cell-timeout` seconds per
cell), so their pages show real results; a cell that raises fails the build. As in nbdev-test, `#| eval: false` cells
and notebooks whose frontmatter says `skip_exec: true` are not run.

Math: rendered at build time by KaTeX (node, version pinned in tools/package-lock.json; `npm ci` runs when
tools/node_modules lacks it), CSS and fonts bundled in `assets/katex/`, so math needs no script and no network. TeX
KaTeX can't parse is shown as code after a "TeX?" marker and counted in the build log. Search: a client-side index
(`assets/search-index.js`, `assets/search.json`) and `assets/search.js`; the only scripts, all local.

Apart from `--execute`, no notebook is executed. Like nbdev, the build runs the exported cells and the `show_doc`
calls, so that `show_doc` can inspect live objects. Unlike nbdev, which also runs every cell that contains an import
(whole, tests and model loading included), the imports of other cells are only run, and only the import statements,
if an exported or `show_doc` cell raises NameError without them. `--nbdev-exec` restores nbdev's exact rule.
One repair to nbdev 3.3.26 / fastcore: `show_doc` of a flax NNX Module dies with NameError (see `_patch_signature`).

Output: `<out>/<notebook stem>.html` per notebook (`00_config.html`, ...; sub-folders kept), `<out>/index.html` (from
`nbs/index.ipynb` when present, else generated), `<out>/sidebar.json` (the page list), `<out>/assets/`.
Links written for nbdev's page names (`config.html`, or `<doc_host>/config.html#x`) point at this site's pages, and a
link to a method that has no entry of its own (`engine.html#engine.generate`) at its class's entry.
Exits 1 naming the notebook and the cell when a notebook fails to process or to execute.
"""
from __future__ import annotations

import argparse, concurrent.futures as cf, fnmatch, html, json, multiprocessing as mp, os, re, shutil, sys, time, traceback
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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
        """Source of the imports of a code cell that is neither exported nor a show_doc call ('' when it has none;
        imports nested in `with`, `if` or `for` blocks count), else None: the cell itself is then never run"""
        if P.cell_lang(cell) != 'python' or not cell.source or cell.cell_type != 'code': return None
        if cell.directives_.keys() & {'export', 'exports', 'exporti', 'exec_doc'}: return None
        if cell.directives_.get('eval', '').lower() == 'false': return None
        trees = cell.parsed_()
        if not trees or P._show_docs(trees): return None
        imps = [n for t in trees for n in ast.walk(t) if isinstance(n, (ast.Import, ast.ImportFrom))]
        return '\n'.join(ast.unparse(n) for n in imps)

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
            if (src := _deferred_imports(cell)) is not None:
                if src: self.pending.append(src)
                return
            if not P._do_eval(cell): return
            self.k.cell(cell)
            if isinstance(self.k.exc, NameError) and self.pending:
                imps, self.pending = '\n'.join(self.pending), []
                self.k.run(imps)
                if self.k.exc: self._fail(cell, imps, self.k.exc)
                self.k.cell(cell)
            if self.k.exc: self._fail(cell, cell.source, self.k.exc)
    return exec_show_docs

def execute(path: Path, timeout: int) -> dict | None:
    ("The notebook at `path` run top to bottom by nbclient, in its folder, with this Python's kernel. As nbdev-test: "
     "cells with `#| eval: false` are not run, nor is a notebook whose frontmatter says `skip_exec: true` (None)")
    import nbformat
    from nbclient import NotebookClient
    from fastcore.basics import str2bool
    from fastcore.nbio import read_nb, nb_frontmatter, fm_default_eval, does_cell_eval
    fnb = read_nb(path)
    fm = nb_frontmatter(fnb)
    if str2bool(fm.get('skip_exec', False)): return None
    dflt = fm_default_eval(fm)
    nb = nbformat.read(path, as_version=4)
    saved = {i: nb.cells[i].source for i, c in enumerate(fnb.cells)
             if c.cell_type == 'code' and not does_cell_eval(c, dflt)}
    for i in saved: nb.cells[i].source = ''  # nbclient skips empty cells
    NotebookClient(nb, timeout=timeout, kernel_name='python3', allow_errors=False, record_timing=False,
                   resources={'metadata': {'path': str(path.parent)}}).execute()
    for i, src in saved.items(): nb.cells[i].source = src
    return json.loads(nbformat.writes(nb))

def nbdev_process(path: Path, nbdev_exec: bool = False, nb_dict: dict | None = None):
    "Run nbdev's docs processors on the notebook at `path` (or on `nb_dict`, its executed copy); (cells, frontmatter)"
    from fastcore.nbio import read_nb, dict2nb
    from nbdev.process import NBProcessor
    from nbdev.processors import FilterDefaults
    nb = read_nb(path) if nb_dict is None else dict2nb(nb_dict)
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
    res = {'rel': job['rel'], 'page': job['page'], 'executed': job['execute']}
    try:
        os.environ.setdefault('JAX_PLATFORMS', 'cpu')
        os.environ['IN_TEST'] = '1'  # as nbdev.serve_drv
        os.chdir(src.parent)
        warnings.simplefilter('ignore')
        _patch_signature()
        from bs4 import BeautifulSoup
        import docs_site as S
        nb_dict = execute(src, job['cell_timeout']) if job['execute'] else None
        res['executed'], res['exec_seconds'] = nb_dict is not None, round(time.time() - t0, 2)
        cells, fm = nbdev_process(src, job['nbdev_exec'], nb_dict)
        body, css = nb_html(to_nbformat(cells))
        soup = BeautifulSoup(body, 'html.parser')
        res['math_failed'] = S.render_all_math(soup)
        for a in soup.find_all('a', class_='source-link'):
            a['target'] = '_blank'; a['rel'] = 'noopener'
            if a['href'].endswith('#LNone'): a['href'] = a['href'][:-len('#LNone')]
        res['toc'] = S.fix_headings(soup)
        S.rewrite_links(soup, job['pages'], job['doc_url'], job['page'])
        res.update(body=str(soup), css=css, title=str(fm.get('title') or src.stem),
                   description=full_description(src, str(fm.get('description') or '')),
                   sections=S.search_sections(soup), ok=True)
    except BaseException as e:
        res.update(ok=False, error=f'{type(e).__name__}: {e}', trace=traceback.format_exc())
    res['seconds'] = round(time.time() - t0, 2)
    return res

# ---------------------------------------------------------------------------------------------------------------
# Assembling the site

def matches(rel: Path, patterns: list[str]) -> bool:
    "Does the notebook path (under nbs/) match one of the globs (`tutorials/*`, `tutorials/*.ipynb`, `09_losses`)?"
    p = rel.as_posix()
    return any(fnmatch.fnmatch(p, g) or fnmatch.fnmatch(p.removesuffix('.ipynb'), g) for g in patterns)

def run_workers(jobs_: list[dict], jobs: int) -> list[dict] | None:
    "Process every notebook in spawned workers, the executed ones first (they take longest); results in page order"
    # workers are spawned (fresh interpreters, as nbdev does) and find `process_one` by importing this file as a module
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import build_docs as worker_mod
    done = {}
    try:
        with cf.ProcessPoolExecutor(max_workers=max(1, jobs), mp_context=mp.get_context('spawn')) as ex:
            futs = [ex.submit(worker_mod.process_one, j) for j in sorted(jobs_, key=lambda j: not j['execute'])]
            for f in cf.as_completed(futs):
                r = f.result()
                extra = f", executed in {r['exec_seconds']}s" if r['executed'] and r['ok'] else ''
                extra += f", {len(r['math_failed'])} formula(s) KaTeX can't parse" if r.get('math_failed') else ''
                print(f"  {r['rel']}: {'ok' if r['ok'] else 'FAILED'} ({r['seconds']}s{extra})", flush=True)
                done[r['rel']] = r
    except cf.process.BrokenProcessPool as e:
        left = [j['rel'] for j in jobs_ if j['rel'] not in done]
        print(f'build_docs: FAILED: a worker process died ({e}; out of memory?) while processing one of: '
              f"{', '.join(left)}", file=sys.stderr)
        return None
    return [done[j['rel']] for j in jobs_]

def write_site(out: Path, nbs: Path, results: list[dict], site_title: str, site_desc: str) -> list[dict]:
    "Pages, sidebar.json, assets, search index and the files the notebooks refer to; returns the page entries"
    import docs_site as S
    out.mkdir(parents=True, exist_ok=True)
    try: old_pages = {e['page'] for e in json.loads((out / 'sidebar.json').read_text())['pages']}
    except (OSError, ValueError, KeyError, TypeError): old_pages = set()
    for f in nbs.rglob('*'):  # images and other files the notebooks refer to
        rel = f.relative_to(nbs)
        if f.is_file() and f.suffix.lower() in ASSET_SUFFIXES and not _skipped(rel):
            (out / rel).parent.mkdir(parents=True, exist_ok=True); shutil.copyfile(f, out / rel)
    has_index = any(r['page'] == 'index.html' for r in results)
    entries = ([] if has_index else [dict(page='index.html', title='Home', description=site_desc, source=None)])
    entries += [dict(page=r['page'], title=r['title'], description=r['description'], source=f"{nbs.name}/{r['rel']}")
                for r in results]
    bodies, repaired = S.repair_fragments({r['page']: r['body'] for r in results})
    for line in repaired: print(f'  link repaired: {line}')
    pages = [(r['page'], r['title'], r['description'], bodies[r['page']], S.toc_html(r['toc'])) for r in results]
    if not has_index:
        pages.append(('index.html', site_title, '', S.generated_index(entries[1:], site_desc), ''))
    for page, title, desc, body, toc in pages:
        (out / page).parent.mkdir(parents=True, exist_ok=True)
        (out / page).write_text(S.page_html(
            title=title, description=desc, body=body, nav=S.nav_html(entries, page), toc=toc,
            site_title=site_title, site_desc=site_desc, page=page, is_index=page == 'index.html'))
    search = [dict(page=r['page'], title=r['title'], **s) for r in results for s in r['sections']]
    if not has_index: search.insert(0, dict(page='index.html', title='Home', anchor='', heading='', text=site_desc))
    S.write_assets(out, results[0]['css'], search)
    (out / 'sidebar.json').write_text(json.dumps({'title': site_title, 'pages': entries}, indent=1) + '\n')
    for stale in old_pages - {e['page'] for e in entries}:  # pages of notebooks since removed or renamed
        (out / stale).unlink(missing_ok=True)
    return entries

def build(out: Path, jobs: int, nbdev_exec: bool, nbs: Path | None = None, execute: list[str] = (),
          cell_timeout: int = 1200) -> int:
    t0 = time.time()
    os.chdir(ROOT)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import docs_site as S
    from nbdev.config import get_config, nbpath2html
    cfg = get_config()
    nbs = Path(nbs or cfg.nbs_path).resolve()
    site_title, site_desc = cfg.get('title') or cfg.lib_name, cfg.get('description', '')
    doc_url = f"{cfg.get('doc_host', '').rstrip('/')}{cfg.get('doc_baseurl', '').rstrip('/')}/" if cfg.get('doc_host') else ''
    rels = find_notebooks(nbs)
    if not rels:
        print(f'build_docs: no notebooks under {nbs}', file=sys.stderr); return 1
    try: katex_version = S.ensure_katex()
    except Exception as e:
        print(f'build_docs: FAILED: {e}', file=sys.stderr); return 1
    # nbdev's page names (config.html, what its links use) -> this site's (00_config.html)
    pages = {nbpath2html(r).as_posix(): page_of(r) for r in rels}
    jobs_ = [dict(path=str(nbs / r), rel=r.as_posix(), page=page_of(r), pages=pages, doc_url=doc_url,
                  nbdev_exec=nbdev_exec, execute=matches(r, execute), cell_timeout=cell_timeout) for r in rels]
    n_exec = sum(j['execute'] for j in jobs_)
    print(f'build_docs: {len(rels)} notebooks from {nbs} -> {out} ({jobs} worker{"s" * (jobs > 1)}; '
          f'{n_exec} matching --execute; KaTeX {katex_version})', flush=True)
    results = run_workers(jobs_, jobs)
    if results is None: return 1
    failed = [r for r in results if not r['ok']]
    if failed:
        for r in failed:
            print(f"\nbuild_docs: FAILED to process {nbs.name}/{r['rel']}:\n{r['error']}\n{r['trace']}", file=sys.stderr)
        print(f"build_docs: {len(failed)} notebook(s) failed: {', '.join(r['rel'] for r in failed)}", file=sys.stderr)
        return 1
    entries = write_site(out, nbs, results, site_title, site_desc)
    bad_math = [(r['rel'], t) for r in results for t in r['math_failed']]
    for rel, tex in bad_math: print(f'  KaTeX could not parse, shown as code: {rel}: {tex.strip()[:120]!r}')
    print(f'build_docs: wrote {len(entries)} pages to {out} in {time.time() - t0:.1f}s; '
          f'{len(bad_math)} formula(s) KaTeX could not parse', flush=True)
    return 0

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('--out', default=None, help='output folder (default: _site in the repo root)')
    ap.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1), help='worker processes (default: 2)')
    ap.add_argument('--nbs', default=None, help="notebook folder (default: nbdev's nbs_path)")
    ap.add_argument('--execute', default='tutorials/*', metavar='PATTERN',
                    help="run the notebooks whose path under nbs/ matches these globs (comma-separated) before "
                         "rendering them (default: 'tutorials/*'; '' for none)")
    ap.add_argument('--cell-timeout', type=int, default=1200, help='seconds per cell when executing (default: 1200)')
    ap.add_argument('--nbdev-exec', action='store_true',
                    help="run every cell that contains an import, whole, as nbdev does (default: no test cell "
                         "runs; their imports run only if a show_doc or exported cell needs them)")
    a = ap.parse_args(argv)
    out = Path(a.out) if a.out else ROOT / '_site'
    patterns = [g.strip() for g in a.execute.split(',') if g.strip()]
    return build(out.resolve(), a.jobs, a.nbdev_exec, a.nbs and Path(a.nbs).resolve(), patterns, a.cell_timeout)

if __name__ == '__main__':
    sys.exit(main())
