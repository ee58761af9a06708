// Independent readers -> canonical values (same conventions as expected.json)
import fs from 'fs';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/node';
import { parquetReadObjects, parquetMetadata } from 'hyparquet';
import { compressors } from 'hyparquet-compressors';
import { duckConn } from './writers.mjs';
import { binv } from './common.mjs';
import { parquetHeader } from './node_modules/hyparquet/src/column.js';

const UNIT_NS = { s: 1000000000n, ms: 1000000n, us: 1000n, ns: 1n };
function fmtDecimal(big, scale) {
  const neg = big < 0n; let s = (neg ? -big : big).toString().padStart(scale + 1, '0');
  if (scale) s = s.slice(0, -scale) + '.' + s.slice(-scale);
  return (neg ? '-' : '') + s;
}

// ---------- DuckDB ----------
function canonDuck(ty, v) {
  if (v == null) return null;
  switch (ty.t) {
    case 'int8': case 'int16': case 'int32': case 'int64': case 'uint8': case 'uint16': case 'uint32': case 'uint64': return BigInt(v);
    case 'hugeint': return Number(v);
    case 'float': case 'double': case 'float16': return Number(v);
    case 'bool': case 'string': return v;
    case 'binary': return binv(v.bytes);
    case 'date32': return v.days;
    case 'timestamp': {
      const ns = v.nanos ?? (v.micros != null ? v.micros * 1000n : v.millis != null ? v.millis * 1000000n : v.seconds * 1000000000n);
      return ns / UNIT_NS[ty.unit];
    }
    case 'time': {
      const ns = v.nanos ?? v.micros * 1000n;
      return ns / UNIT_NS[ty.unit];
    }
    case 'decimal': case 'uuid': return v.toString();
    case 'interval': return { months: v.months, days: v.days, millis: Number(v.micros / 1000n) };
    case 'list': case 'fixed_list': return v.items.map((x) => canonDuck(ty.of, x));
    case 'struct': return Object.fromEntries(ty.fields.map(([n, t]) => [n, canonDuck(t, v.entries[n])]));
    case 'map': return v.entries.map(({ key, value }) => ({ key: canonDuck(ty.key, key), value: canonDuck(ty.value, value) }));
  }
  throw new Error('canonDuck ' + ty.t);
}
export async function readDuck(file, tab) {
  const c = await duckConn();
  const r = await c.runAndReadAll(`SELECT * FROM read_parquet('${file}')`);
  const names = r.columnNames();
  const rows = r.getRows();
  const out = {};
  for (const col of tab.columns) {
    const k = names.indexOf(col.name);
    out[col.name] = k < 0 ? { missing: true } : rows.map((row) => canonDuck(col.type, row[k]));
  }
  return { num_rows: rows.length, columns: out };
}
export async function duckMeta(file) {
  const c = await duckConn();
  const fm = (await c.runAndReadAll(`SELECT created_by, num_rows, num_row_groups, format_version FROM parquet_file_metadata('${file}')`)).getRowObjectsJson()[0];
  const cm = (await c.runAndReadAll(`SELECT path_in_schema, type, compression, encodings, string_agg(DISTINCT encodings, ' | ') OVER (PARTITION BY path_in_schema) AS all_enc, row_group_id, num_values FROM parquet_metadata('${file}') ORDER BY row_group_id, column_id`)).getRowObjectsJson();
  const kv = (await c.runAndReadAll(`SELECT decode(key) AS k, decode(value) AS v FROM parquet_kv_metadata('${file}')`)).getRowObjectsJson();
  const sch = (await c.runAndReadAll(`SELECT name, type, type_length, repetition_type, converted_type, scale, precision, logical_type FROM parquet_schema('${file}')`)).getRowObjectsJson();
  const perCol = {};
  for (const m of cm) {
    const p = perCol[m.path_in_schema] ||= { physical_type: m.type, compression: new Set(), encodings: new Set() };
    p.compression.add(m.compression);
    for (const e of String(m.encodings).split(', ')) p.encodings.add(e);
  }
  for (const p of Object.values(perCol)) { p.compression = [...p.compression].join(','); p.encodings = [...p.encodings].sort(); }
  return { created_by: fm.created_by, num_rows: Number(fm.num_rows), num_row_groups: Number(fm.num_row_groups), format_version: fm.format_version, column_chunks: perCol, key_value_metadata: Object.fromEntries(kv.map((x) => [x.k, x.v])), schema: sch };
}

// ---------- parquet-wasm (arrow-rs reader) -> apache-arrow JS ----------
function canonArrowNested(ty, v) {
  if (v == null) return null;
  switch (ty.t) {
    case 'int8': case 'int16': case 'int32': case 'int64': case 'uint8': case 'uint16': case 'uint32': case 'uint64': return BigInt(v);
    case 'float': case 'double': case 'float16': case 'hugeint': return Number(v);
    case 'bool': case 'string': return v;
    case 'binary': return binv(v);
    case 'uuid': { const h = Buffer.from(v).toString('hex'); return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`; }
    case 'list': case 'fixed_list': return [...v].map((x) => canonArrowNested(ty.of, x));
    case 'struct': return Object.fromEntries(ty.fields.map(([n, t]) => [n, canonArrowNested(t, v[n])]));
    case 'map': return [...v].map(([key, value]) => ({ key: canonArrowNested(ty.key, key), value: canonArrowNested(ty.value, value) }));
  }
  throw new Error('canonArrowNested ' + ty.t);
}
function rawColumn(vec, ty) {
  const out = [];
  let g = 0;
  for (const d of vec.data) {
    for (let j = 0; j < d.length; j++, g++) {
      if (!vec.isValid(g)) { out.push(null); continue; }
      const k = d.offset + j;
      switch (ty.t) {
        case 'timestamp': case 'time': case 'date32': out.push(BigInt(d.values[k])); break; // raw unit
        case 'float16': {
          const h = d.values[k]; const s = h & 0x8000 ? -1 : 1; const e = (h >> 10) & 31; const m = h & 1023;
          out.push(e === 0 ? s * m * 2 ** -24 : s * (1 + m / 1024) * 2 ** (e - 15)); break;
        }
        case 'decimal': {
          let big = 0n; for (let w = 3; w >= 0; w--) big = (big << 32n) | BigInt(d.values[k * 4 + w]);
          out.push(fmtDecimal(BigInt.asIntN(128, big), ty.s)); break;
        }
      }
    }
  }
  if (ty.t === 'date32') return out.map((x) => (x == null ? null : Number(x)));
  return out;
}
export function readPw(file, tab) {
  const u8 = new Uint8Array(fs.readFileSync(file));
  const t = pw.readParquet(u8);
  const at = arrow.tableFromIPC(t.intoIPCStream());
  const out = {};
  for (const col of tab.columns) {
    const vec = at.getChild(col.name);
    if (!vec) { out[col.name] = { missing: true }; continue; }
    if (col.type.t === 'interval') { out[col.name] = { skipped: `arrow-rs reads Parquet INTERVAL as ${vec.type} (months dropped)` }; continue; }
    if (['timestamp', 'time', 'date32', 'float16', 'decimal'].includes(col.type.t)) out[col.name] = rawColumn(vec, col.type);
    else { const a = []; for (let i = 0; i < vec.length; i++) a.push(canonArrowNested(col.type, vec.get(i))); out[col.name] = a; }
  }
  return { num_rows: at.numRows, columns: out, arrow_schema: at.schema.fields.map((f) => `${f.name}: ${f.type}`) };
}

// ---------- hyparquet ----------
const HP_PARSERS = {
  timestampFromMilliseconds: (v) => ({ __ns: BigInt(v) * 1000000n }),
  timestampFromMicroseconds: (v) => ({ __ns: BigInt(v) * 1000n }),
  timestampFromNanoseconds: (v) => ({ __ns: BigInt(v) }),
  dateFromDays: (d) => ({ __days: d }),
};
function canonHyp(ty, v) {
  if (v == null) return null;
  switch (ty.t) {
    case 'int8': case 'int16': case 'int32': case 'int64': case 'uint8': case 'uint16': case 'uint32': case 'uint64': return BigInt(v);
    case 'float': case 'double': case 'float16': case 'hugeint': return Number(v);
    case 'bool': case 'string': case 'uuid': return v;
    case 'binary': return binv(v);
    case 'date32': return v.__days;
    case 'timestamp': return v.__ns / UNIT_NS[ty.unit];
    case 'time': return BigInt(v);
    case 'decimal': return { __approx: Number(v) };
    case 'list': case 'fixed_list': return v.map((x) => canonHyp(ty.of, x));
    case 'struct': return Object.fromEntries(ty.fields.map(([n, t]) => [n, canonHyp(t, v[n])]));
    case 'map': return Object.entries(v).map(([key, value]) => ({ key: canonHyp(ty.key, key), value: canonHyp(ty.value, value) }));
  }
  throw new Error('canonHyp ' + ty.t);
}
// walk every page header of every column chunk (thrift parsing from hyparquet)
export async function hypPageCounts(file) {
  const buf = fs.readFileSync(file);
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  const md = parquetMetadata(ab);
  const view = new DataView(ab);
  const out = {};
  for (const rg of md.row_groups) {
    for (const cc of rg.columns) {
      const m = cc.meta_data; const k = m.path_in_schema.join('.');
      const o = out[k] ||= { pages: {}, value_encodings: new Set() };
      const start = Number(m.dictionary_page_offset ?? m.data_page_offset);
      const end = start + Number(m.total_compressed_size);
      const reader = { view, offset: start };
      while (reader.offset < end) {
        const h = parquetHeader(reader);
        o.pages[h.type] = (o.pages[h.type] || 0) + 1;
        const e = h.data_page_header?.encoding || h.data_page_header_v2?.encoding || h.dictionary_page_header && 'dict:' + h.dictionary_page_header.encoding;
        if (e) o.value_encodings.add(e);
        reader.offset += h.compressed_page_size;
      }
    }
  }
  for (const o of Object.values(out)) o.value_encodings = [...o.value_encodings].sort();
  return out;
}
export async function readHyp(file, tab) {
  const buf = fs.readFileSync(file);
  const ab = buf.buffer.slice(buf.byteOffset, buf.byteOffset + buf.byteLength);
  const skip = tab.columns.filter((c) => c.type.t === 'interval').map((c) => c.name);
  const cols = tab.columns.filter((c) => !skip.includes(c.name));
  const rows = await parquetReadObjects({ file: ab, compressors, utf8: false, parsers: HP_PARSERS, rowFormat: 'object', columns: cols.map((c) => c.name) });
  const out = {};
  for (const col of cols) out[col.name] = rows.map((r) => canonHyp(col.type, r[col.name]));
  for (const s of skip) out[s] = { skipped: 'hyparquet: INTERVAL not supported' };
  const md = parquetMetadata(ab);
  return { num_rows: Number(md.num_rows), columns: out };
}
