// Writes the Arrow IPC test files of tests/data/arrow with Apache Arrow JS (apache-arrow on
// npm; `npm install apache-arrow@21.2.0` here, then `node gen.mjs OUT_FOLDER`). Arrow JS's
// file writer puts no Schema message before the batches: the schema is in the footer only,
// where Arrow's readers take it from.
import * as A from 'apache-arrow';
import fs from 'fs';
import path from 'path';

const out = process.argv[2] ?? '.';
const rows = 4;
const id = A.vectorFromArray([10, 11, 12, 13], new A.Int32());
const name = A.vectorFromArray(['cat', 'dog', null, 'ζήτα'], new A.Utf8());
const label = A.vectorFromArray(['dog', 'cat', 'dog', 'dog'], new A.Dictionary(new A.Utf8(), new A.Int8()));
const vec = A.vectorFromArray([[1, 2, 3], [4, 5, 6], [7, 8, 9], [0.5, 0.25, 0.125]],
  new A.FixedSizeList(3, new A.Field('item', new A.Float32(), false)));
const turn = new A.Struct([new A.Field('role', new A.Utf8(), true), new A.Field('content', new A.Utf8(), true)]);
const messages = A.vectorFromArray(
  [[{ role: 'user', content: 'hi' }, { role: 'assistant', content: 'hello' }], [], null, [{ role: 'user', content: '?' }]],
  new A.List(new A.Field('item', turn, true)));
const entry = new A.Struct([new A.Field('key', new A.Utf8(), false), new A.Field('value', new A.Float32(), true)]);
const scores = A.vectorFromArray(
  [new Map([['bleu', 0.5], ['rouge', 0.75]]), new Map(), null, new Map([['bleu', 0.25]])],
  new A.Map_(new A.Field('entries', entry, false)));
const table = new A.Table({ id, name, label, vec, messages, scores });
if (table.numRows !== rows) throw new Error('rows');
fs.writeFileSync(path.join(out, 'arrowjs.arrow'), A.tableToIPC(table, 'file'));
fs.writeFileSync(path.join(out, 'arrowjs.arrows'), A.tableToIPC(table, 'stream'));
