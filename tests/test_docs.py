"""The offline docs site: `tools/build_docs.py` builds it, headless Chromium reads it.

Chromium is Debian's (`apt-get update && apt-get install -y chromium`). Without it these browser tests skip, except
under CI (env CI set), where a missing browser is a failure.
"""
import json, os, re, shutil, subprocess, sys
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / 'tools' / 'build_docs.py'
NBS = ROOT / 'nbs'
FLAGS = ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync']
# page stem -> exported symbols whose API entry (show_doc) must be on it
API = {'01_model': ['Decoder', 'ModelConfig'], '03a_from_gguf': ['from_gguf'], '03b_to_maxpost': ['to_maxpost'],
       '03c_to_huggingface': ['to_huggingface'], '03d_check_logits': ['check_logits']}

def _in_ci() -> bool: return os.environ.get('CI', '').strip().lower() not in ('', '0', 'false', 'no')

def build(out: Path, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BUILD), '--out', str(out), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)

@pytest.fixture(scope='module')
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp('site')
    r = build(out)
    assert r.returncode == 0, f'build_docs failed:\n{r.stdout}\n{r.stderr}'
    return out

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

def dump_dom(exe, tmp_path, page: Path) -> BeautifulSoup:
    "The DOM Chromium renders from `page`"
    r = _chrome(exe, tmp_path, '--dump-dom', page.as_uri())
    assert r.returncode == 0 and '<html' in r.stdout, f'chromium --dump-dom {page} failed:\n{r.stderr[-2000:]}'
    return BeautifulSoup(r.stdout, 'html.parser')

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
    for f in site.rglob('*.html'):
        s = f.read_text()
        assert '<script' not in s.lower(), f'{f.name} has a script'
        remote = re.findall(r'<(?:link|img|iframe)[^>]+(?:href|src)="(?:https?:)?//[^"]+"', s)
        assert not remote, f'{f.name} loads remote resources: {remote[:3]}'

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

def test_screenshots_are_not_blank(chromium, site, tmp_path):
    from PIL import Image
    for page in ('index.html', '01_model.html'):
        png = tmp_path / (page + '.png')
        r = _chrome(chromium, tmp_path, '--hide-scrollbars', '--window-size=1280,900', f'--screenshot={png}',
                    (site / page).as_uri())
        assert png.is_file() and png.stat().st_size > 5000, f'no screenshot of {page}:\n{r.stderr[-2000:]}'
        lo, hi = Image.open(png).convert('L').getextrema()
        assert hi - lo > 100, f'{page} renders blank'

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
    assert 'Area of a' in page and 'math-svg' in page and '$x^2$' not in page
    assert soup.find('h3', id='fraction') is not None and not (tmp_path / 'ran').exists()
    side = json.loads((out / 'sidebar.json').read_text())
    assert [e['title'] for e in side['pages']] == ['Home', 'Demo page']

def test_failing_notebook_fails_the_build(tmp_path):
    nbs = tmp_path / 'nbs'
    _nb(nbs / '06_broken.ipynb', [('md', '# Broken'), ('code', '#| export\nimport no_such_module_xyz')])
    r = build(tmp_path / 'site', '--nbs', str(nbs))
    assert r.returncode != 0
    assert '06_broken.ipynb' in r.stderr and 'no_such_module_xyz' in r.stderr
