import fs from 'fs';
import path from 'path';
import { OUT, T, J, typeStr, canonExpected, VALUE_CONVENTIONS, base50, rows1000, encTable, f16exact, typesTable, nestedTable, chatTable, hfTable, HF_META, largeTable, sliceTable, dictTable } from './common.mjs';
import { VERSIONS, duckConn, duckWrite, pwWrite, hwWrite } from './writers.mjs';
import { readDuck, readPw, readHyp, duckMeta, hypPageCounts } from './readers.mjs';

fs.mkdirSync(OUT, { recursive: true });
await duckConn();
const only = process.argv[2] ? new RegExp(process.argv[2]) : null;

// ---------------- datasets ----------------
const B50 = base50();
const R1000 = rows1000();
const ENC = encTable();
const TYP = typesTable();
const NEST = nestedTable();
const HF = hfTable();
const CHAT = chatTable();
const LARGE = largeTable();
const DICT = dictTable();
const R5000 = rows1000(5000);
const pick = (tab, names) => ({ num_rows: tab.num_rows, columns: tab.columns.filter((c) => names.includes(c.name)) });
const add = (tab, cols) => ({ num_rows: tab.num_rows, columns: [...tab.columns, ...cols] });

const TIME_COLS = [
  { name: 'time_ms', type: T.time('ms'), values: [0, 1, 43200000, 86399999, 3723004, null, 1000, 60000, 3600000, 86399000] },
  { name: 'time_us', type: T.time('us'), values: [0n, 1n, 43200000000n, 86399999999n, 3723004005n, null, 1000n, 60000000n, 3600000000n, 86399000000n] },
  { name: 'time_ns', type: T.time('ns'), values: [0n, 1n, 43200000000000n, 86399999999999n, 3723004005006n, null, 1000n, 60000000000n, 3600000000000n, 86399000000000n] },
];
const F16 = { name: 'f16', type: T.f16, values: f16exact() };
const DEC = [
  { name: 'dec_9_2', type: T.dec(9, 2), values: ['0.00', '1.23', '-1.23', '9999999.99', '-9999999.99', null, '0.01', '123.40', '-0.05', '42.00'] },
  { name: 'dec_18_4', type: T.dec(18, 4), values: ['0.0000', '12345678901234.5678', '-99999999999999.9999', '0.0001', '-0.0001', null, '1.5000', '100.0000', '-7.0700', '31415926535.8979'] },
  { name: 'dec_38_10', type: T.dec(38, 10), values: ['0.0000000000', '1234567890123456789012345678.1234567890', '-9999999999999999999999999999.9999999999', '0.0000000001', '-1.0000000000', null, '3.1415926536', '100.0000000000', '-42.4200000000', '12345.6789000000'] },
];
const DUCK_EXTRA = [
  { name: 'time_us', type: T.time('us'), values: TIME_COLS[1].values },
  ...DEC,
  { name: 'hugeint', type: T.hugeint, values: [0n, 1n, -1n, 2n ** 126n, -(2n ** 120n), null, 2n ** 70n, 42n, -42n, 9007199254740994n] },
  { name: 'uuid', type: T.uuid, values: ['00000000-0000-0000-0000-000000000000', '123e4567-e89b-12d3-a456-426614174000', 'ffffffff-ffff-ffff-ffff-ffffffffffff', '7f000000-0000-0000-8000-000000000001', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', null, '550e8400-e29b-41d4-a716-446655440000', '00000000-0000-0000-0000-000000000001', '80000000-0000-0000-0000-000000000000', '6ba7b810-9dad-11d1-80b4-00c04fd430c8'] },
  { name: 'interval', type: T.interval, values: [{ months: 0, days: 0, millis: 0 }, { months: 1, days: 2, millis: 3 }, { months: 14, days: 0, millis: 0 }, { months: 0, days: 400, millis: 0 }, { months: 0, days: 0, millis: 86399999 }, null, { months: 2, days: 3, millis: 4000 }, { months: 0, days: 1, millis: 1 }, { months: 100, days: 10, millis: 10 }, { months: 7, days: 0, millis: 500 }] },
];
// DuckDB supports tz only as TIMESTAMPTZ (us)
const TYP_DUCK = add(pick(TYP, ['i8', 'i16', 'u8', 'u16', 'u32', 'u64', 'date', 'ts_ms', 'ts_us', 'ts_ns', 'ts_us_utc']), DUCK_EXTRA);
const TYP_PW = add(TYP, [...TIME_COLS, F16, ...DEC]);

// ---------------- jobs ----------------
const jobs = [];
const J_ = (name, writer, tab, opts, covers, extra = {}) => jobs.push({ name, writer, tab, opts, covers, ...extra });

// DuckDB
for (const c of ['uncompressed', 'snappy', 'gzip', 'zstd', 'brotli', 'lz4_raw'])
  J_(`duckdb_codec_${c}`, 'duckdb', B50, `COMPRESSION ${c}`, `codec ${c.toUpperCase()} on base 50-row table (int32,int64,float,double,bool,string,binary with nulls)`);
J_('duckdb_v2_zstd', 'duckdb', B50, "COMPRESSION zstd, PARQUET_VERSION v2", 'DuckDB PARQUET_VERSION V2 (still V1 data pages, but DELTA_BINARY_PACKED/DELTA_LENGTH_BYTE_ARRAY/BYTE_STREAM_SPLIT), zstd; int64 column holds INT64_MIN/MAX');
J_('duckdb_v2_rows', 'duckdb', R1000, "COMPRESSION snappy, PARQUET_VERSION v2", 'DuckDB PARQUET_VERSION V2 on 1000-row table without int64 extremes');
J_('duckdb_rowgroups', 'duckdb', R5000, 'COMPRESSION snappy, ROW_GROUP_SIZE 1024', '5000 rows, ROW_GROUP_SIZE 1024 -> DuckDB rounds to its 2048-row vectors: row groups of 2048, 2048, 904');
J_('duckdb_dict', 'duckdb', DICT, 'COMPRESSION uncompressed', 'low-cardinality columns: DuckDB dictionary pages, data pages tagged PLAIN_DICTIONARY (legacy id 2)');
J_('duckdb_dict_off', 'duckdb', DICT, 'COMPRESSION uncompressed, DICTIONARY_SIZE_LIMIT 1', 'same table, dictionary disabled (DICTIONARY_SIZE_LIMIT 1) -> PLAIN');
J_('duckdb_types', 'duckdb', TYP_DUCK, 'COMPRESSION snappy', 'int8/int16/uint8/uint16/uint32/uint64, date, timestamp ms/us/ns, timestamptz (us, UTC), time(us), decimal(9,2)/(18,4)/(38,10), HUGEINT, UUID, INTERVAL', { selfCheck: 'duckdb' });
J_('duckdb_nested', 'duckdb', NEST, 'COMPRESSION snappy', 'list<int32> (empty/null rows), list<int32> with null elements, FLOAT[8] embedding, list<list<int16>>, list<string>, HF Image struct<bytes,path>, struct<a,b:struct<c>>, map<string,int32>, list<struct<x,y>>');
J_('duckdb_nested_v2', 'duckdb', NEST, 'COMPRESSION zstd, PARQUET_VERSION v2', 'nested columns with DuckDB PARQUET_VERSION V2');
J_('duckdb_chat', 'duckdb', CHAT, 'COMPRESSION zstd', 'lists of structs: chat messages list<struct<role, content: string>> (one conversation empty, one null), detection objects list<struct<bbox FLOAT[4], category int64>>');
J_('duckdb_hf_image', 'duckdb', HF, `COMPRESSION snappy, KV_METADATA {huggingface: '${HF_META}'}`, 'Hugging Face Image+ClassLabel layout with "huggingface" key-value metadata', { kv: { huggingface: HF_META } });
J_('duckdb_empty', 'duckdb', sliceTable(B50, 0), 'COMPRESSION snappy', 'empty table (0 rows), base schema');
J_('duckdb_one_row', 'duckdb', sliceTable(B50, 1), 'COMPRESSION snappy', 'single row, base schema');
J_('duckdb_large_100k', 'duckdb', LARGE, 'COMPRESSION snappy', '100k rows int64 + string + double, snappy (speed check)', {
  tableSql: "SELECT (i*3 + 1000000000000)::BIGINT AS id, 'name_' || ((i*7919) % 100003) || '_' || (['alpha','beta','gamma','delta','épsilon','ζήτα','猫'])[(i % 7) + 1] AS name, (((i * 104729) % 1000003) / 8 - 60000)::DOUBLE AS value FROM range(100000) r(i) ORDER BY i",
});

// parquet-wasm
const PWC = { uncompressed: 'UNCOMPRESSED', snappy: 'SNAPPY', gzip: 'GZIP', brotli: 'BROTLI', zstd: 'ZSTD', lz4_raw: 'LZ4_RAW', lz4_hadoop: 'LZ4' };
for (const [k, v] of Object.entries(PWC))
  J_(`pw_codec_${k}`, 'parquet-wasm', B50, { compression: v }, `codec ${v}${v === 'LZ4' ? ' (deprecated LZ4 codec id 5; arrow-rs writes Hadoop-framed LZ4: per block 4-byte BE uncompressed size, 4-byte BE compressed size, raw LZ4 block)' : ''} on base 50-row table`, v === 'LZ4' ? { selfCheck: 'parquet-wasm' } : {});
J_('pw_v1_dict', 'parquet-wasm', B50, { compression: 'UNCOMPRESSED', version: 'V1', dictionary: true }, 'data page V1, dictionary on (RLE_DICTIONARY + PLAIN dict page)');
J_('pw_v1_plain', 'parquet-wasm', B50, { compression: 'UNCOMPRESSED', version: 'V1', dictionary: false }, 'data page V1, dictionary off (PLAIN)');
J_('pw_v2_dict', 'parquet-wasm', B50, { compression: 'UNCOMPRESSED', version: 'V2', dictionary: true }, 'data page V2, dictionary on');
J_('pw_v2_plain', 'parquet-wasm', B50, { compression: 'UNCOMPRESSED', version: 'V2', dictionary: false }, 'data page V2, dictionary off (arrow-rs V2 defaults: RLE booleans, DELTA_* for ints/strings)');
J_('pw_v2_snappy', 'parquet-wasm', B50, { compression: 'SNAPPY', version: 'V2', dictionary: true }, 'data page V2 compressed (levels uncompressed, values snappy)');
const encSets = {
  delta_binary_packed: { i32_sorted: 'DELTA_BINARY_PACKED', i32_random: 'DELTA_BINARY_PACKED', i64: 'DELTA_BINARY_PACKED' },
  delta_length_byte_array: { str_prefix: 'DELTA_LENGTH_BYTE_ARRAY', bin: 'DELTA_LENGTH_BYTE_ARRAY' },
  delta_byte_array: { str_prefix: 'DELTA_BYTE_ARRAY', bin: 'DELTA_BYTE_ARRAY' },
  byte_stream_split: { f32: 'BYTE_STREAM_SPLIT', f64: 'BYTE_STREAM_SPLIT' },
  byte_stream_split_int: { i32_random: 'BYTE_STREAM_SPLIT', i64: 'BYTE_STREAM_SPLIT' },
  rle_bool: { bool: 'RLE' },
};
for (const ver of ['V1', 'V2'])
  for (const [k, e] of Object.entries(encSets))
    J_(`pw_enc_${k}_${ver.toLowerCase()}`, 'parquet-wasm', ENC, { compression: 'UNCOMPRESSED', version: ver, encodings: e }, `forced ${Object.entries(e).map(([c, x]) => c + '=' + x).join(', ')} (dictionary off for those columns), data page ${ver}`);
J_('pw_rowgroups_pages', 'parquet-wasm', R1000, { compression: 'SNAPPY', rowGroupSize: 100, dataPageSize: 128, batchSize: 8, dictionary: false }, '1000 rows, 10 row groups of 100, data page size limit 128 B + write batch 8 -> many pages per column chunk (V1)');
J_('pw_rowgroups_pages_v2_dict', 'parquet-wasm', R1000, { compression: 'ZSTD', version: 'V2', rowGroupSize: 100, dataPageSize: 128, batchSize: 8, dictionary: true }, 'same as pw_rowgroups_pages but data page V2 + dictionary + zstd');
J_('pw_types', 'parquet-wasm', TYP_PW, { compression: 'SNAPPY' }, 'int8/int16/uint8/uint16/uint32/uint64, date32, timestamp ms/us/ns naive and UTC, time32[ms]/time64[us]/time64[ns], float16, decimal128(9,2)/(18,4)/(38,10) (INT32/INT64/FLBA physical)');
J_('pw_nested', 'parquet-wasm', NEST, { compression: 'SNAPPY' }, 'same nested columns as duckdb_nested (embedding is arrow fixed_size_list<float,8>)');
J_('pw_nested_v2_plain', 'parquet-wasm', NEST, { compression: 'UNCOMPRESSED', version: 'V2', dictionary: false }, 'nested columns, data page V2, no dictionary');
J_('pw_chat', 'parquet-wasm', CHAT, { compression: 'SNAPPY', version: 'V2' }, 'the lists of structs of duckdb_chat from arrow-rs, data page V2');
J_('pw_hf_image', 'parquet-wasm', HF, { compression: 'SNAPPY', kv: { huggingface: HF_META } }, 'Hugging Face Image+ClassLabel layout with "huggingface" key-value metadata', { kv: { huggingface: HF_META } });
J_('pw_empty', 'parquet-wasm', sliceTable(B50, 0), { compression: 'SNAPPY' }, 'empty table (0 rows), base schema');
J_('pw_one_row', 'parquet-wasm', sliceTable(B50, 1), { compression: 'SNAPPY' }, 'single row, base schema');
J_('pw_large_100k', 'parquet-wasm', LARGE, { compression: 'SNAPPY' }, '100k rows int64 + string + double, snappy (arrow-rs defaults: 1 row group, dictionary w/ fallback)');

// hyparquet-writer
for (const c of ['UNCOMPRESSED', 'SNAPPY', 'GZIP', 'BROTLI'])
  J_(`hw_codec_${c.toLowerCase()}`, 'hyparquet-writer', B50, { codec: c }, `codec ${c} on base 50-row table`);
J_('hw_encodings', 'hyparquet-writer', ENC, { codec: 'UNCOMPRESSED', encodings: { i32_sorted: 'DELTA_BINARY_PACKED', i64: 'DELTA_BINARY_PACKED', f32: 'BYTE_STREAM_SPLIT', f64: 'BYTE_STREAM_SPLIT', str_prefix: 'DELTA_BYTE_ARRAY', bin: 'DELTA_LENGTH_BYTE_ARRAY', bool: 'RLE' } }, 'per-column encodings from a third writer');
J_('hw_float16', 'hyparquet-writer', { num_rows: 10, columns: [F16, { name: 'i32', type: T.i32, values: [1, 2, 3, null, 5, 6, 7, 8, 9, 10] }] }, { codec: 'SNAPPY' }, 'FLOAT16 logical type (FIXED_LEN_BYTE_ARRAY(2))');
J_('hw_rowgroups_pages', 'hyparquet-writer', R1000, { codec: 'SNAPPY', rowGroupSize: 100, pageSize: 256 }, '1000 rows, row groups of 100, page size 256 B');
J_('hw_hf_image_kv', 'hyparquet-writer', { num_rows: HF.num_rows, columns: [{ name: 'label', type: T.i64, values: HF.columns[1].values }] }, { codec: 'SNAPPY', kv: { huggingface: HF_META } }, 'key-value metadata from hyparquet-writer (label only; no struct support used)', { kv: { huggingface: HF_META } });

// ---------------- run ----------------
function deepEq(e, a) {
  if (a && typeof a === 'object' && '__approx' in a) return e != null && Math.abs(Number(e) - a.__approx) <= 1e-9 * Math.max(1, Math.abs(a.__approx));
  if (Array.isArray(e)) return Array.isArray(a) && e.length === a.length && e.every((x, i) => deepEq(x, a[i]));
  if (e && typeof e === 'object') return a && typeof a === 'object' && Object.keys(e).every((k) => deepEq(e[k], a[k]));
  return J(e) === J(a);
}
const READERS = { duckdb: readDuck, 'parquet-wasm': readPw, hyparquet: readHyp };
const READERS_FOR = { duckdb: ['parquet-wasm', 'hyparquet'], 'parquet-wasm': ['duckdb', 'hyparquet'], 'hyparquet-writer': ['duckdb', 'parquet-wasm', 'hyparquet'] };
const WRITER_INFO = {
  duckdb: () => ({ name: 'duckdb', version: VERSIONS.duckdb, package: `@duckdb/node-api ${VERSIONS['@duckdb/node-api']}` }),
  'parquet-wasm': () => ({ name: 'parquet-wasm (arrow-rs parquet crate compiled to WASM)', version: VERSIONS['parquet-wasm'], input_built_with: `apache-arrow JS ${VERSIONS['apache-arrow']}` }),
  'hyparquet-writer': () => ({ name: 'hyparquet-writer', version: VERSIONS['hyparquet-writer'] }),
};
const summary = [];
for (const job of jobs) {
  if (only && !only.test(job.name)) continue;
  const file = path.join(OUT, job.name + '.parquet');
  const rec = { name: job.name, writer: job.writer, covers: job.covers };
  try {
    if (job.writer === 'duckdb') await duckWrite(job.tab, file, job.opts, job.tableSql);
    else if (job.writer === 'parquet-wasm') pwWrite(job.tab, file, job.opts);
    else hwWrite(job.tab, file, job.opts);
  } catch (e) { rec.error = 'WRITE: ' + (e.message || e); summary.push(rec); console.log(job.name, rec.error); continue; }
  rec.size = fs.statSync(file).size;
  let meta = null;
  try { meta = await duckMeta(file); } catch (e) { rec.meta_error = e.message; }
  const verify = {};
  const rlist = [...READERS_FOR[job.writer], ...(job.selfCheck ? [job.selfCheck] : [])];
  for (const r of rlist) {
    try {
      const got = await READERS[r](file, job.tab);
      const bad = [];
      if (got.num_rows !== job.tab.num_rows) bad.push(`num_rows ${got.num_rows} != ${job.tab.num_rows}`);
      for (const c of job.tab.columns) {
        const g = got.columns[c.name];
        if (g && !Array.isArray(g)) { bad.push(`${c.name}: ${JSON.stringify(g)}`); continue; }
        const exp = c.values.map((v) => canonExpected(c.type, v));
        if (!deepEq(exp, g)) {
          const i = exp.findIndex((x, k) => !deepEq(x, g[k]));
          bad.push(`${c.name}: row ${i} expected ${J(exp[i])} got ${J(g[i])}`);
        }
      }
      verify[r === job.selfCheck ? r + ' (SAME library as writer; only for columns no independent reader handles)' : r] = bad.length ? bad : 'OK';
    } catch (e) { verify[r] = ['READ ERROR: ' + (e.message || String(e)).slice(0, 300)]; }
  }
  rec.verify = verify;
  try { rec.pages = await hypPageCounts(file); } catch (e) { rec.pages = { error: e.message }; }
  const expected = {
    file: job.name + '.parquet',
    writer: WRITER_INFO[job.writer](),
    options: job.opts,
    covers: job.covers,
    num_rows: job.tab.num_rows,
    key_value_metadata: job.kv || {},
    columns: job.tab.columns.map((c) => ({ name: c.name, type: typeStr(c.type), values: c.values.map((v) => canonExpected(c.type, v)) })),
    parquet_metadata_seen_by_duckdb: meta,
    pages_per_column: rec.pages,
    verified_by: verify,
    value_conventions: VALUE_CONVENTIONS,
  };
  const vals = expected.columns.map((c) => c.values);
  expected.columns.forEach((c, i) => { c.values = `__VALS_${i}__`; });
  let txt = J(expected, 1);
  vals.forEach((v, i) => { txt = txt.replace(`"__VALS_${i}__"`, () => J(v)); });
  if (job.kv) for (const [k, v] of Object.entries(job.kv)) if (!meta || meta.key_value_metadata[k] !== v) rec.kv_error = `kv ${k} missing/different`;
  fs.writeFileSync(path.join(OUT, job.name + '.expected.json'), txt + '\n');
  rec.meta = meta && { created_by: meta.created_by, rg: meta.num_row_groups, cols: Object.fromEntries(Object.entries(meta.column_chunks).map(([k, v]) => [k, `${v.physical_type} ${v.compression} [${v.encodings.join(',')}]`])) };
  summary.push(rec);
  console.log(job.name, rec.size, JSON.stringify(verify));
}
fs.writeFileSync(OUT + '/summary.json', J({ versions: VERSIONS, summary }, 1));
