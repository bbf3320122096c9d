"""The offline docs site: `tools/build_docs.py` builds it (tutorials executed), headless Chromium reads it.

Chromium is Debian's (`make system-deps`, or `apt-get update && apt-get install -y chromium`). Without it these
browser tests skip, except under CI (env CI set), where a missing browser is a failure. Screenshots of the index, a
tutorial with a plot (the SFT tutorial), an API page, the losses page (math) and a page with a plot are written to `$MAXPOST_ARTIFACTS/docs_screenshots`
(default `runs/docs_screenshots/`, git-ignored) for a person to look at.
"""
import atexit, functools, http.server, json, os, re, shutil, subprocess, sys, threading
from pathlib import Path

import pytest
from bs4 import BeautifulSoup
from conftest import private_tmp

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / 'tools' / 'build_docs.py'
NBS = ROOT / 'nbs'
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync']
# page stem -> exported symbols whose API entry (show_doc) must be on it
API = {'01_model': ['Decoder', 'ModelConfig'], '03a_from_gguf': ['from_gguf'], '03b_to_maxpost': ['to_maxpost'],
       '03c_to_huggingface': ['to_huggingface'], '03d_check_logits': ['check_logits']}

SHOTS = Path(os.environ.get('MAXPOST_ARTIFACTS') or ROOT / 'runs') / 'docs_screenshots'
VTIME = '--virtual-time-budget=10000'  # let deferred scripts (search) run before the DOM is dumped

def _in_ci() -> bool: return os.environ.get('CI', '').strip().lower() not in ('', '0', 'false', 'no')

def build(out: Path, *args) -> subprocess.CompletedProcess:
    "Run build_docs.py into `out`; the tutorials it runs write their work folders to a TMPDIR removed afterwards."
    tmp = private_tmp('build_docs')
    try: return subprocess.run([sys.executable, str(BUILD), '--out', str(out), *args], cwd=ROOT, capture_output=True,
                               text=True, timeout=2400, env=dict(os.environ, TMPDIR=str(tmp)))
    finally: shutil.rmtree(tmp, ignore_errors=True)

_SITE: dict = {}   # the full site's background build: Popen, output folder, its TMPDIR, its log

def start_site_build() -> dict:
    """Start the full site's build (every tutorial executed) in the background, once. conftest calls this when the
    session's tests are collected, so the build runs beside the tests before this module's: much of their time is one
    busy thread (XLA compiles, Python), and the build's workers use the other core."""
    if not _SITE:
        import tempfile
        out, tmp, log = private_tmp('site'), private_tmp('build_docs'), tempfile.TemporaryFile()
        p = subprocess.Popen([sys.executable, str(BUILD), '--out', str(out)], cwd=ROOT, stdout=log,
                             stderr=subprocess.STDOUT, env=dict(os.environ, TMPDIR=str(tmp)))
        _SITE.update(p=p, out=out, tmp=tmp, log=log)
    return _SITE

@atexit.register
def _stop_site_build():
    "An interrupted session leaves no build behind."
    if _SITE and _SITE['p'].poll() is None: _SITE['p'].kill()

@pytest.fixture(scope='module')
def site():
    b = start_site_build()
    try: rc = b['p'].wait(timeout=2400)       # the tutorials run in the build
    except subprocess.TimeoutExpired: b['p'].kill(); b['p'].wait(); rc = 'killed after 2400 s'
    shutil.rmtree(b['tmp'], ignore_errors=True)   # the tutorials' work folders
    b['log'].seek(0); log = b['log'].read().decode(errors='replace')
    assert rc == 0, f'build_docs failed ({rc}):\n{log[-8000:]}'
    return b['out']

@pytest.fixture(scope='module')
def chromium():
    exe = next((p for p in ('/usr/bin/chromium', shutil.which('chromium') or '') if p and os.access(p, os.X_OK)), None)
    if exe is None:
        msg = 'headless Chromium not found at /usr/bin/chromium (apt-get update && apt-get install -y chromium)'
        if _in_ci(): pytest.fail(f'{msg}; CI is set, so the browser test may not be skipped')
        pytest.skip(msg)
    return exe

def _chrome(exe, tmp_path, *args) -> subprocess.CompletedProcess:
    profile = tmp_path / 'chromium-profile'
    profile.mkdir(exist_ok=True)
    return subprocess.run([exe, *FLAGS, f'--user-data-dir={profile}', *args], capture_output=True, text=True, timeout=180)

def dump_dom(exe, tmp_path, page: Path | str, query: str = '') -> BeautifulSoup:
    "The DOM Chromium renders from `page` (a file or a URL), scripts run"
    url = page.as_uri() if isinstance(page, Path) else page
    r = _chrome(exe, tmp_path, VTIME, '--dump-dom', url + query)
    assert r.returncode == 0 and '<html' in r.stdout, f'chromium --dump-dom {url} failed:\n{r.stderr[-2000:]}'
    return BeautifulSoup(r.stdout, 'html.parser')

def screenshot(exe, tmp_path, page: Path, name: str, query: str = '') -> Path:
    "A 1280x1400 screenshot of `page`, kept under SHOTS; fails if missing or blank"
    from PIL import Image
    SHOTS.mkdir(parents=True, exist_ok=True)
    png = SHOTS / name
    png.unlink(missing_ok=True)
    r = _chrome(exe, tmp_path, VTIME, '--hide-scrollbars', '--window-size=1280,1400', f'--screenshot={png}',
                page.as_uri() + query)
    assert png.is_file() and png.stat().st_size > 5000, f'no screenshot of {page}:\n{r.stderr[-2000:]}'
    lo, hi = Image.open(png).convert('L').getextrema()
    assert hi - lo > 100, f'{page} renders blank'
    return png

def image_widths(exe, tmp_path, page: Path) -> list[int]:
    "naturalWidth of every <img> of `page` as Chromium loaded it (a copy of the page with a probe script, same folder)"
    probe = page.with_name(f'_probe_{page.name}')
    js = ("<script>window.addEventListener('load', function () { for (const i of document.images) "
          "i.setAttribute('data-natural-width', i.naturalWidth); });</script></body>")
    probe.write_text(page.read_text().replace('</body>', js))
    try: dom = dump_dom(exe, tmp_path, probe)
    finally: probe.unlink()
    return [int(i.get('data-natural-width', -1)) for i in dom.find('main').find_all('img')]

def notebooks():
    return sorted(p.relative_to(NBS) for p in NBS.rglob('*.ipynb')
                  if not any(s.startswith(('_', '.')) for s in p.relative_to(NBS).parts))

def test_every_notebook_has_a_page_in_the_nav(site):
    side = json.loads((site / 'sidebar.json').read_text())
    pages = [e['page'] for e in side['pages']]
    assert 'index.html' in pages
    for rel in notebooks():
        page = rel.with_suffix('.html').as_posix()
        assert page in pages, f'{rel} missing from sidebar.json'
        assert (site / page).is_file(), f'{page} not written'
    for e in side['pages']:
        assert e['title'].strip(), e
        nav = BeautifulSoup((site / e['page']).read_text(), 'html.parser').find('nav', class_='sidebar')
        hrefs = [a['href'].split('/')[-1] for a in nav.find_all('a')]
        assert hrefs == [p.split('/')[-1] for p in pages], f"{e['page']}: the nav lists {hrefs}"

def test_pages_need_nothing_online(site):
    "No remote resource; the only scripts are the site's own files (search); math is HTML at build time, no script"
    for f in site.rglob('*.html'):
        s = f.read_text()
        remote = re.findall(r'<(?:link|img|iframe|script)[^>]+(?:href|src)="(?:https?:)?//[^"]+"', s)
        assert not remote, f'{f.name} loads remote resources: {remote[:3]}'
        for tag in BeautifulSoup(s, 'html.parser').find_all('script'):
            assert tag.get('src') and not tag.get_text().strip(), f'{f.name}: inline script {str(tag)[:200]}'
            assert (f.parent / tag['src']).is_file(), f"{f.name}: script {tag['src']} missing"
    css = (site / 'assets' / 'katex' / 'katex.min.css').read_text()
    fonts = set(re.findall(r'url\((fonts/[^)]+\.woff2)\)', css))
    assert len(fonts) > 10 and all((site / 'assets' / 'katex' / u).is_file() for u in fonts), sorted(fonts)[:5]
    assert not re.search(r'https?://', (site / 'assets' / 'search.js').read_text()), 'search.js names a URL'

def test_internal_links_resolve(site):
    "Every link between pages (nbdev's backtick links included) lands on a page and, with a #fragment, on an id"
    ids = {}
    for f in site.rglob('*.html'):
        soup = BeautifulSoup(f.read_text(), 'html.parser')
        ids[f.resolve()] = ({t['id'] for t in soup.find_all(id=True)}, soup)
    bad = []
    for f, (_, soup) in ids.items():
        for a in soup.find_all('a', href=True):
            href = a['href']
            if re.match(r'[a-z]+:', href) or href.startswith('//'): continue
            path, _, frag = href.partition('#')
            target = (f.parent / path).resolve() if path else f
            if target.suffix != '.html': continue
            if target not in ids or (frag and frag not in ids[target][0]): bad.append(f'{f.name}: {href}')
    assert not bad, bad[:20]

def test_index_links_model_and_converters(chromium, site, tmp_path):
    dom = dump_dom(chromium, tmp_path, site / 'index.html')
    hrefs = {a['href'] for a in dom.find_all('a', href=True)}
    assert '01_model.html' in hrefs, sorted(hrefs)
    for stem in ('03a', '03b', '03c', '03d'):
        hit = [h for h in hrefs if re.fullmatch(rf'{stem}_\w+\.html', h)]
        assert hit, f'index links no {stem}_*.html page: {sorted(hrefs)}'
        assert (site / hit[0]).is_file()
    assert dom.find('nav', class_='sidebar').find('a', href='01_model.html').get_text(strip=True)

@pytest.mark.parametrize('stem', sorted(API))
def test_api_docs_rendered(chromium, site, tmp_path, stem):
    dom = dump_dom(chromium, tmp_path, site / f'{stem}.html')
    main = dom.find('main')
    text = main.get_text('\n')
    for sym in API[stem]:
        h = main.find(['h3', 'h4'], id=sym.lower())
        assert h is not None and h.get_text(strip=True).startswith(sym), f'{stem}: no API heading for {sym}'
        sigs = [p.get_text() for p in main.select('.jp-OutputArea pre')]
        assert any(re.search(rf'\b(?:def|class)\s+{sym}\(', s) for s in sigs), f'{stem}: no signature for {sym}'
    # show_doc machinery and nbdev directives never reach the reader
    assert 'show_doc(' not in text and '#| export' not in text and '#| hide' not in text
    assert main.find('a', class_='source-link') is not None

def tutorial_pages(site) -> list[Path]:
    return sorted((site / 'tutorials').glob('*.html'))

PLOT_TUTORIAL = 'sft_chat_data'   # a tutorial whose executed page shows a plot (the loss curve) and tables

def test_screenshots(chromium, site, tmp_path):
    "Index, a tutorial with a plot, an API page and the losses page (math), kept as artifacts; none blank"
    tut = site / 'tutorials' / f'{PLOT_TUTORIAL}.html'
    assert tut.is_file(), f'no tutorial page {tut.name}: {[p.name for p in tutorial_pages(site)]}'
    for page, name in [(site / 'index.html', 'index.png'), (tut, f'tutorial_{tut.stem}.png'),
                       (site / '01_model.html', 'api_01_model.png'), (site / '09_losses.html', 'math_09_losses.png')]:
        screenshot(chromium, tmp_path, page, name)

def test_tutorial_plots_and_tables(chromium, site, tmp_path):
    "The SFT, GRPO, evaluation, tool-use and distillation tutorials, executed at build time, show their plots (loaded) and tables"
    for stem in (PLOT_TUTORIAL, 'grpo_custom_reward', 'evaluate_a_checkpoint', 'rl_with_a_tool', 'distil_a_small_model'):
        page = site / 'tutorials' / f'{stem}.html'
        main = BeautifulSoup(page.read_text(), 'html.parser').find('main')
        plots = [i for i in main.select('.jp-OutputArea-output img') if i.get('src', '').startswith('data:image/png')]
        assert plots, f'{stem}: no plot among the outputs'
        assert main.select('.jp-OutputArea-output table'), f'{stem}: no table among the outputs'
        widths = image_widths(chromium, tmp_path, page)
        assert len(widths) >= len(plots) and all(w > 200 for w in widths), f'{stem}: {widths}'

def test_tutorials_executed_with_outputs(chromium, site, tmp_path):
    "The tutorials run at build time: their pages show outputs, and every image on them loads"
    for page in tutorial_pages(site):
        dom = BeautifulSoup(page.read_text(), 'html.parser')
        outs = [o for o in dom.select('.jp-OutputArea-output') if o.get_text(strip=True) or o.find('img')]
        assert outs, f'{page.name}: no executed output'
        widths = image_widths(chromium, tmp_path, page)
        assert all(w > 0 for w in widths), f'{page.name}: an image does not load: {widths}'

def test_math_renders(chromium, site, tmp_path):
    "KaTeX's HTML is on the losses page as Chromium renders it, and no raw TeX delimiter is left in the visible text"
    dom = dump_dom(chromium, tmp_path, site / '09_losses.html')
    main = dom.find('main')
    assert len(main.select('.katex')) > 20 and main.select('.katex-display'), 'no KaTeX output'
    assert not main.select('.math-error'), [e.get_text()[:80] for e in main.select('.math-error')]
    for m in main.select('.katex-mathml'): m.decompose()  # the TeX source, kept for screen readers
    text = main.get_text(' ')
    assert '$$' not in text and '\\frac' not in text and '\\begin{' not in text, 'raw TeX left on the page'

def _serve(site):
    "The site on a local HTTP server (127.0.0.1, a free port): (server, base url)"
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args): pass
    handler = functools.partial(Quiet, directory=str(site))
    srv = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, f'http://127.0.0.1:{srv.server_port}/'

def _search_hits(dom) -> list[str]:
    box = dom.find(id='search-results')
    assert box is not None and not box.has_attr('hidden'), 'the search results are not shown'
    return [a['href'] for a in box.select('a.search-hit')]

def test_search_finds_a_term(chromium, site, tmp_path):
    "The search box finds GSPO on the losses page, from file:// and over http, on a page in a sub-folder too"
    hits = _search_hits(dump_dom(chromium, tmp_path, site / 'index.html', '?q=GSPO'))
    assert any(h.split('#')[0] == '09_losses.html' for h in hits[:5]), hits
    assert any('#' in h for h in hits), f'no hit links a section: {hits}'
    screenshot(chromium, tmp_path, site / 'index.html', 'search_GSPO.png', '?q=GSPO')
    tut = tutorial_pages(site)[0]
    hits = _search_hits(dump_dom(chromium, tmp_path, tut, '?q=GSPO'))
    assert any(h.split('#')[0] == '../09_losses.html' for h in hits), hits
    srv, base = _serve(site)
    try:
        hits = _search_hits(dump_dom(chromium, tmp_path, base + 'index.html', '?q=gspo%20clip'))
        assert any(h.split('#')[0] == '09_losses.html' for h in hits), hits
        none = dump_dom(chromium, tmp_path, base + '01_model.html', '?q=zzqqxx_no_such_word')
        assert not _search_hits(none) and 'No match' in none.find(id='search-results').get_text()
    finally:
        srv.shutdown()

def test_executed_plot_loads(chromium, tmp_path):
    "A tutorial that draws a matplotlib plot, built with --execute: the plot is embedded and loads in the browser"
    nbs = tmp_path / 'nbs'
    _nb(nbs / 'tutorials' / 'plot_demo.ipynb', [
        ('md', '# Plot demo\n\n> A tutorial with a plot.'),
        ('md', 'Squares $y = x^2$, and $$\\sum_{i=1}^n i^2 = \\frac{n(n+1)(2n+1)}{6}$$ and broken $\\frac{1}{$ TeX.'),
        ('code', 'import matplotlib.pyplot as plt\nplt.figure(figsize=(4, 3)); plt.plot([1, 2, 3], [1, 4, 9]); plt.show()'),
        ('code', 'print("PRINTED", 6 * 7)'),
        ('code', '#| eval: false\nraise ValueError("NEVER_RUN")'),  # not run, as nbdev-test
    ])
    _nb(nbs / 'not_run.ipynb', [('md', '# Not run'), ('code', 'print("NOT_EXECUTED")')])
    out = tmp_path / 'site'
    r = build(out, '--nbs', str(nbs), '--execute', 'tutorials/*', '--cell-timeout', '120')
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'executed in' in r.stdout and '1 formula(s) KaTeX could not parse' in r.stdout, r.stdout
    page = out / 'tutorials' / 'plot_demo.html'
    html_ = page.read_text()
    assert 'data:image/png;base64,' in html_ and 'PRINTED 42' in html_
    not_run = BeautifulSoup((out / 'not_run.html').read_text(), 'html.parser')
    assert 'NOT_EXECUTED' in not_run.get_text() and not not_run.select('.jp-OutputArea-output')
    soup = BeautifulSoup(html_, 'html.parser')
    assert soup.select('.katex-display') and soup.select_one('.math-error code').get_text() == '\\frac{1}{'
    assert soup.select_one('.math-error-mark').get_text() == 'TeX?'
    widths = image_widths(chromium, tmp_path, page)
    assert widths and all(w > 200 for w in widths), widths
    screenshot(chromium, tmp_path, page, 'plot_tutorial.png')

# --- nbdev's processing on a notebook made here: hide / export / show_doc, and a failing notebook -------------------

def _nb(path: Path, cells):
    import nbformat
    from nbformat import v4
    nb = v4.new_notebook(cells=[v4.new_markdown_cell(s) if k == 'md' else v4.new_code_cell(s) for k, s in cells])
    nb.metadata['kernelspec'] = {'name': 'python3', 'display_name': 'Python 3', 'language': 'python'}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)

def test_hide_export_and_show_doc(tmp_path):
    nbs = tmp_path / 'nbs'
    _nb(nbs / '05_demo.ipynb', [
        ('md', '# Demo page\n\n> A page built in a test.'),
        ('code', '#| hide\nHIDDEN_MARKER = 1'),
        ('code', '#| export\ndef area(w:float, # width\n         h:float=2.0, # height\n        )->float:\n'
                 '    "Area of a `w` by `h` rectangle."\n    return w * h * EXPORT_BODY_MARKER'),
        ('md', 'Some prose with $x^2$ math.'),
        ('code', 'VISIBLE_MARKER = 3'),
        # a test cell: never run by the docs build (nbdev would, for its import); its import is kept for show_doc
        ('code', f'from fractions import Fraction\nimport pathlib\npathlib.Path({str(tmp_path / "ran")!r}).touch()'),
        ('code', 'show_doc(Fraction)'),
    ])
    _nb(nbs / '_skipped.ipynb', [('md', '# Skipped')])
    out = tmp_path / 'site'
    r = build(out, '--nbs', str(nbs))
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.glob('*.html')) == ['05_demo.html', 'index.html']
    page = (out / '05_demo.html').read_text()
    soup = BeautifulSoup(page, 'html.parser')
    assert soup.find('h1').get_text(strip=True) == 'Demo page' and 'A page built in a test.' in page
    assert 'HIDDEN_MARKER' not in page and 'EXPORT_BODY_MARKER' not in page and 'VISIBLE_MARKER' in page
    assert soup.find('h3', id='area') is not None
    sig = soup.select_one('.jp-OutputArea pre').get_text()
    assert 'def area(' in sig and '# width' in sig and 'h:float=2.0' in sig
    assert 'Area of a' in page and 'class="katex"' in page and '$x^2$' not in page
    assert soup.find('h3', id='fraction') is not None and not (tmp_path / 'ran').exists()
    side = json.loads((out / 'sidebar.json').read_text())
    assert [e['title'] for e in side['pages']] == ['Home', 'Demo page']

def test_failing_notebook_fails_the_build(tmp_path):
    nbs = tmp_path / 'nbs'
    _nb(nbs / '06_broken.ipynb', [('md', '# Broken'), ('code', '#| export\nimport no_such_module_xyz')])
    r = build(tmp_path / 'site', '--nbs', str(nbs))
    assert r.returncode != 0
    assert '06_broken.ipynb' in r.stderr and 'no_such_module_xyz' in r.stderr

def test_failing_tutorial_fails_the_build(tmp_path):
    nbs = tmp_path / 'nbs'
    _nb(nbs / 'tutorials' / 'broken.ipynb', [('md', '# Broken tutorial'), ('code', 'raise ValueError("boom_xyz")')])
    r = build(tmp_path / 'site', '--nbs', str(nbs))
    assert r.returncode != 0
    assert 'tutorials/broken.ipynb' in r.stderr and 'boom_xyz' in r.stderr, r.stderr[-3000:]
    assert build(tmp_path / 'site2', '--nbs', str(nbs), '--execute', '').returncode == 0  # not executed: it builds
    import nbformat  # nor is a notebook whose frontmatter says skip_exec, as nbdev-test
    nb = nbformat.read(nbs / 'tutorials' / 'broken.ipynb', as_version=4)
    nb.cells.insert(0, nbformat.v4.new_raw_cell('---\nskip_exec: true\n---'))
    nbformat.write(nb, nbs / 'tutorials' / 'broken.ipynb')
    r = build(tmp_path / 'site3', '--nbs', str(nbs))
    assert r.returncode == 0 and 'executed in' not in r.stdout, r.stdout + r.stderr

def test_repair_fragments_unlinks_private_names():
    "A method link without an entry points at its class; a private name without an entry is left as its code."
    sys.path.insert(0, str(ROOT / 'tools'))
    import docs_site as S
    page = ('<div id="Cls"></div><h2 id="_kept">t</h2><a href="a.html#_helper"><code>_helper</code></a> '
            '<a href="a.html#Cls.m"><code>m</code></a> <a href="a.html#_kept">k</a> <a href="a.html#missing">x</a>')
    out, fixed = S.repair_fragments({'a.html': page})
    assert '<code>_helper</code> ' in out['a.html'] and 'href="a.html#_helper"' not in out['a.html']
    assert 'href="a.html#Cls"' in out['a.html'] and 'href="a.html#_kept"' in out['a.html']
    assert 'href="a.html#missing"' in out['a.html'], 'a public name without an entry stays a (broken) link: the site test catches it'
    assert len(fixed) == 2, fixed
