// Client-side search of the docs site built by tools/build_docs.py; no dependency, works from file:// and http.
// The index (assets/search-index.js: window.maxpostSearchIndex = [{page, title, anchor, heading, text}, ...]) is
// loaded on first use. Every word of the query must occur in a section (its heading or text, or the page title for
// a page's first entry); title and heading hits rank first.
// A page opened with ?q=term searches at once (the search form submits that way when JavaScript is off).
(function () {
  'use strict';
  var script = document.currentScript;
  var root = (script && script.getAttribute('data-root')) || '';
  var index = null, waiting = [];

  function load(cb) {
    if (index) return cb();
    waiting.push(cb);
    if (waiting.length > 1) return;
    var s = document.createElement('script');
    s.src = root + 'assets/search-index.js';
    s.onload = function () { index = window.maxpostSearchIndex || []; waiting.splice(0).forEach(function (f) { f(); }); };
    document.head.appendChild(s);
  }

  function count(hay, w) { var n = 0, i = hay.indexOf(w); while (i >= 0) { n++; i = hay.indexOf(w, i + w.length); } return n; }

  function search(q) {
    var words = q.toLowerCase().split(/\s+/).filter(Boolean), hits = [];
    if (!words.length) return hits;
    index.forEach(function (e) {
      // a page's title is searched in its first entry only, so that a word of the title does not match every section
      var title = e.anchor ? '' : e.title.toLowerCase(), head = e.heading.toLowerCase(), text = e.text.toLowerCase();
      var score = 0;
      for (var i = 0; i < words.length; i++) {
        var w = words[i], t = count(title, w), h = count(head, w), x = count(text, w);
        if (!t && !h && !x) return;
        score += 20 * Math.min(t, 1) + 20 * Math.min(h, 1) + Math.min(x, 10);
      }
      hits.push({e: e, score: score});
    });
    hits.sort(function (a, b) { return b.score - a.score; });
    return hits.slice(0, 25);
  }

  function snippet(text, word) {
    var i = text.toLowerCase().indexOf(word), start = Math.max(0, i - 60);
    if (i < 0) return text.slice(0, 140);
    return (start ? '…' : '') + text.slice(start, start + 160) + (start + 160 < text.length ? '…' : '');
  }

  function show(q, list) {
    list.textContent = '';
    if (!q.trim()) { list.hidden = true; return; }
    var hits = search(q), first = q.toLowerCase().split(/\s+/).filter(Boolean)[0];
    if (!hits.length) {
      var li = document.createElement('li'); li.className = 'search-none'; li.textContent = 'No match for “' + q + '”';
      list.appendChild(li);
    }
    hits.forEach(function (h) {
      var li = document.createElement('li'), a = document.createElement('a'), p = document.createElement('span');
      a.href = root + h.e.page + (h.e.anchor ? '#' + h.e.anchor : '');
      a.className = 'search-hit';
      a.textContent = h.e.title + (h.e.heading && h.e.heading !== h.e.title ? ' › ' + h.e.heading : '');
      p.className = 'search-snippet';
      p.textContent = snippet(h.e.text, first);
      li.appendChild(a); li.appendChild(p); list.appendChild(li);
    });
    list.hidden = false;
  }

  function init() {
    var input = document.getElementById('search-input'), list = document.getElementById('search-results');
    if (!input || !list) return;
    var run = function () { load(function () { show(input.value, list); }); };
    input.addEventListener('focus', function () { load(function () {}); });
    input.addEventListener('input', run);
    input.form.addEventListener('submit', function (ev) {
      ev.preventDefault();
      var a = list.querySelector('a.search-hit');
      if (a) window.location.href = a.href; else run();
    });
    input.addEventListener('keydown', function (ev) { if (ev.key === 'Escape') { list.hidden = true; input.blur(); } });
    document.addEventListener('click', function (ev) { if (!input.form.contains(ev.target)) list.hidden = true; });
    var q = new URLSearchParams(window.location.search).get('q');
    if (q) { input.value = q; run(); }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init); else init();
})();
