// Writes the Polars test files of tests/data/arrow with nodejs-polars 0.26.1, which brings
// the Rust Polars build for the machine (`npm install nodejs-polars@0.26.1 apache-arrow@21.2.0
// fzstd@0.1.1` here; the lz4 command too; then `node polars.mjs OUT_FOLDER`), and
// polars.expected.json: every row as Apache Arrow JS (a reader other than Polars) reads each
// of the three files back. Polars writes its strings as string_view (Utf8View), whose short
// strings lie inline in their 16-byte views and longer ones in the batch's data buffers, its
// categoricals as dictionaries of string_view, and its lists as large_list (writeIPC; its
// writeIPCStream writes large_string instead, Polars' oldest compat level).
import pl from 'nodejs-polars';
import * as A from 'apache-arrow';
import { decompress as unzstd } from 'fzstd';
import { execFileSync } from 'child_process';
import fs from 'fs';
import path from 'path';

const out = process.argv[2] ?? '.';
// Deterministic text: a long string for every third row (past the 12 bytes a view holds inline;
// 10 of 1,200 bytes fill more than one of Polars' 8 KiB data buffers).
const letters = (n, seed) => {
  let s = '', x = seed;
  for (let i = 0; i < n; ++i) { x = (x * 1103515245 + 12345) % 2147483648; s += 'abcdefghijklmnopqrstuvwxyz '[x % 27]; }
  return s;
};
const part = (first, n) => {
  const rows = [...Array(n).keys()].map(i => first + i);
  return pl.DataFrame([
    pl.Series('id', rows, pl.Int64),
    pl.Series('text', rows.map(r => r % 7 === 5 ? null : r % 3 === 0 ? letters(1200, r) : r % 3 === 1 ? `row ${r}` : `ζήτα ${r}`), pl.Utf8),
    pl.Series('label', rows.map(r => ['cat', 'dog', 'bird'][r % 3]), pl.Categorical),
    pl.Series('score', rows.map(r => r % 5 === 4 ? null : r / 4), pl.Float32),
    pl.Series('n', rows.map(r => r % 6 === 2 ? null : r * 3), pl.Int32),
    pl.Series('flag', rows.map(r => r % 8 === 1 ? null : r % 3 === 0), pl.Bool),
    pl.Series('words', rows.map(r => r % 4 === 3 ? [] : [`w${r}`, letters(20 + r % 3, r), 'x']), pl.List(pl.Utf8)),
    pl.Series('emb', rows.map(r => [r, r + 0.5, -r]), pl.FixedSizeList(pl.Float32, 3)),
    pl.Series('tokens', rows.map(r => [...Array(r % 4).keys()].map(k => r * 10 + k)), pl.List(pl.Int32)),
    pl.Series('meta', rows.map(r => ({ src: r % 2 ? 'web' : `a source longer than twelve ${r}`, w: r * 0.5 }))),
    pl.Series('q', rows.map(r => `question ${r}`), pl.Utf8),
    pl.Series('a', rows.map(r => letters(13 + r % 5, r)), pl.Utf8),
  ]).withColumns(pl.concatList([
    pl.struct([pl.lit('user').alias('role'), pl.col('q').alias('content')]),
    pl.struct([pl.lit('assistant').alias('role'), pl.col('a').alias('content')]),
  ]).alias('messages')).drop(['q', 'a']);
};
// Two record batches: Polars writes a frame's chunks as they are.
const df = part(0, 30).vstack(part(30, 15));
console.log(df.dtypes.map(String).join(', '), df.height);
df.writeIPC(path.join(out, 'polars.arrow'));
df.writeIPC(path.join(out, 'polars_zstd.arrow'), { compression: 'zstd' });
df.writeIPCStream(path.join(out, 'polars_lz4.arrows'), { compression: 'lz4' });

// Read back by Arrow JS (its compressed buffers by fzstd and by the lz4 command: lz4js 0.2.0
// misreads Polars' frames): the three files must agree, row for row.
A.compressionRegistry.set(0, { decode: (data) => new Uint8Array(execFileSync('lz4', ['-d', '-c'], { input: data })) });  // LZ4_FRAME
A.compressionRegistry.set(1, { decode: (data) => unzstd(data) });  // ZSTD
const names = ['polars.arrow', 'polars_zstd.arrow', 'polars_lz4.arrows'];
const json = (v) => JSON.stringify(v, (k, x) => (typeof x === 'bigint' ? Number(x) : x));
const rowsOf = (name) => {
  const t = A.tableFromIPC(fs.readFileSync(path.join(out, name)));
  return [...Array(t.numRows).keys()].map(r => JSON.parse(json(t.get(r).toJSON())));
};
const expected = rowsOf(names[0]);
for (const name of names.slice(1))
  if (json(rowsOf(name)) !== json(expected)) throw new Error(`${name} reads back otherwise`);
fs.writeFileSync(path.join(out, 'polars.expected.json'), JSON.stringify({
  writer: 'nodejs-polars 0.26.1 (DataFrame.writeIPC, writeIPCStream; compat level: newest, the default)',
  reader: 'apache-arrow 21.2.0 (tableFromIPC)',
  rows: expected,
}, null, 0) + '\n');
