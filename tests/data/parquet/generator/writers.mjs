import fs from 'fs';
import zlib from 'zlib';
import { createRequire } from 'module';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/node';
import { parquetWriteBuffer } from 'hyparquet-writer';
import { DuckDBInstance } from '@duckdb/node-api';
import { hex } from './common.mjs';
const require = createRequire(import.meta.url);
const pkgv = (p) => JSON.parse(fs.readFileSync(new URL(`./node_modules/${p}/package.json`, import.meta.url))).version;

export const VERSIONS = {
  duckdb: null,
  '@duckdb/node-api': pkgv('@duckdb/node-api'),
  'parquet-wasm': pkgv('parquet-wasm'),
  'apache-arrow': pkgv('apache-arrow'),
  'hyparquet-writer': pkgv('hyparquet-writer'),
  hyparquet: pkgv('hyparquet'),
};

// ================= DuckDB =================
let duck;
export async function duckConn() {
  if (!duck) {
    const inst = await DuckDBInstance.create(':memory:');
    duck = await inst.connect();
    await duck.run("SET TimeZone='UTC'");
    VERSIONS.duckdb = (await duck.runAndReadAll('select version()')).getRows()[0][0];
  }
  return duck;
}
function duckType(ty) {
  switch (ty.t) {
    case 'int8': return 'TINYINT'; case 'int16': return 'SMALLINT'; case 'int32': return 'INTEGER'; case 'int64': return 'BIGINT';
    case 'uint8': return 'UTINYINT'; case 'uint16': return 'USMALLINT'; case 'uint32': return 'UINTEGER'; case 'uint64': return 'UBIGINT';
    case 'float': return 'FLOAT'; case 'double': return 'DOUBLE'; case 'bool': return 'BOOLEAN';
    case 'string': return 'VARCHAR'; case 'binary': return 'BLOB'; case 'date32': return 'DATE';
    case 'timestamp': return ty.tz ? (ty.unit === 'us' ? 'TIMESTAMPTZ' : null) : { ms: 'TIMESTAMP_MS', us: 'TIMESTAMP', ns: 'TIMESTAMP_NS', s: 'TIMESTAMP_S' }[ty.unit];
    case 'time': return ty.unit === 'us' ? 'TIME' : ty.unit === 'ns' ? 'TIME_NS' : null;
    case 'decimal': return `DECIMAL(${ty.p},${ty.s})`;
    case 'uuid': return 'UUID'; case 'interval': return 'INTERVAL'; case 'hugeint': return 'HUGEINT';
    case 'list': return duckType(ty.of) + '[]';
    case 'fixed_list': return `${duckType(ty.of)}[${ty.n}]`;
    case 'struct': return `STRUCT(${ty.fields.map(([n, t]) => `"${n}" ${duckType(t)}`).join(', ')})`;
    case 'map': return `MAP(${duckType(ty.key)}, ${duckType(ty.value)})`;
  }
  throw new Error('duckType ' + ty.t);
}
const q = (s) => `'${s.replace(/'/g, "''")}'`;
function duckLit(ty, v) {
  if (v == null) return `NULL::${duckType(ty)}`;
  switch (ty.t) {
    case 'int8': case 'int16': case 'int32': case 'int64': case 'uint8': case 'uint16': case 'uint32': case 'uint64': case 'hugeint':
      return `${q(String(v))}::${duckType(ty)}`;
    case 'float': case 'double': return `${q(String(v))}::${duckType(ty)}`;
    case 'bool': return v ? 'true' : 'false';
    case 'string': return q(v) + '::VARCHAR';
    case 'binary': return `from_hex('${hex(v)}')`;
    case 'date32': return `(DATE '1970-01-01' + ${v}::INTEGER)`;
    case 'timestamp': {
      const f = { ms: 'epoch_ms', us: 'make_timestamp', ns: 'make_timestamp_ns' }[ty.unit];
      return `${f}(${v}::BIGINT)::${duckType(ty)}`;
    }
    case 'time': return ty.unit === 'us' ? `(TIME '00:00:00' + to_microseconds(${v}::BIGINT))` : null;
    case 'decimal': case 'uuid': return `${q(v)}::${duckType(ty)}`;
    case 'interval': return `(to_months(${v.months}) + to_days(${v.days}) + to_milliseconds(${v.millis}))`;
    case 'list': case 'fixed_list': return `[${v.map((x) => duckLit(ty.of, x)).join(', ')}]::${duckType(ty)}`;
    case 'struct': return `{${ty.fields.map(([n, t]) => `'${n}': ${duckLit(t, v[n])}`).join(', ')}}::${duckType(ty)}`;
    case 'map': return v.length ? `MAP {${v.map(([k, x]) => `${duckLit(ty.key, k)}: ${duckLit(ty.value, x)}`).join(', ')}}::${duckType(ty)}` : `MAP {}::${duckType(ty)}`;
  }
  throw new Error('duckLit ' + ty.t);
}
// copyOpts: string of COPY options, e.g. "COMPRESSION snappy, ROW_GROUP_SIZE 100"
export async function duckWrite(tab, file, copyOpts, tableSql = null) {
  const c = await duckConn();
  await c.run('DROP TABLE IF EXISTS t');
  if (tableSql) {
    await c.run(`CREATE TABLE t AS ${tableSql}`);
  } else {
    await c.run(`CREATE TABLE t (${tab.columns.map((col) => `"${col.name}" ${duckType(col.type)}`).join(', ')})`);
    for (let start = 0; start < tab.num_rows; start += 500) {
      const end = Math.min(tab.num_rows, start + 500);
      const rows = [];
      for (let i = start; i < end; i++) rows.push(`(${tab.columns.map((col) => duckLit(col.type, col.values[i])).join(', ')})`);
      await c.run(`INSERT INTO t VALUES ${rows.join(',\n')}`);
    }
  }
  const order = tab.num_rows ? '' : '';
  await c.run(`COPY (SELECT * FROM t${order}) TO '${file}' (FORMAT parquet${copyOpts ? ', ' + copyOpts : ''})`);
}

// ================= parquet-wasm (arrow-rs) =================
function f16bits(x) {
  // exact conversion for values representable in half precision
  if (x === 0) return Object.is(x, -0) ? 0x8000 : 0;
  const sign = x < 0 ? 0x8000 : 0; x = Math.abs(x);
  let e = Math.floor(Math.log2(x));
  if (e < -14) { return sign | Math.round(x / 2 ** -24); }
  let m = x / 2 ** e - 1;
  return sign | ((e + 15) << 10) | Math.round(m * 1024);
}
function arrowType(ty) {
  const A = arrow;
  switch (ty.t) {
    case 'int8': return new A.Int8(); case 'int16': return new A.Int16(); case 'int32': return new A.Int32(); case 'int64': return new A.Int64();
    case 'uint8': return new A.Uint8(); case 'uint16': return new A.Uint16(); case 'uint32': return new A.Uint32(); case 'uint64': return new A.Uint64();
    case 'float16': return new A.Float16(); case 'float': return new A.Float32(); case 'double': return new A.Float64(); case 'bool': return new A.Bool();
    case 'string': return new A.Utf8(); case 'binary': return new A.Binary(); case 'date32': return new A.DateDay();
    case 'timestamp': return new A.Timestamp({ s: A.TimeUnit.SECOND, ms: A.TimeUnit.MILLISECOND, us: A.TimeUnit.MICROSECOND, ns: A.TimeUnit.NANOSECOND }[ty.unit], ty.tz);
    case 'time': return ty.unit === 'ms' ? new A.TimeMillisecond() : ty.unit === 'us' ? new A.TimeMicrosecond() : new A.TimeNanosecond();
    case 'decimal': return new A.Decimal(ty.s, ty.p, 128);
    case 'list': return new A.List(new A.Field('item', arrowType(ty.of), true));
    case 'fixed_list': return new A.FixedSizeList(ty.n, new A.Field('item', arrowType(ty.of), true));
    case 'struct': return new A.Struct(ty.fields.map(([n, t]) => new A.Field(n, arrowType(t), true)));
    case 'map': return new A.Map_(new A.Field('entries', new A.Struct([new A.Field('key', arrowType(ty.key), false), new A.Field('value', arrowType(ty.value), true)]), false));
  }
  throw new Error('arrowType ' + ty.t);
}
function nullBitmap(values) {
  const bm = new Uint8Array(Math.ceil(values.length / 8) || 1);
  values.forEach((v, i) => { if (v != null) bm[i >> 3] |= 1 << (i & 7); });
  return bm;
}
function rawData(type, values, Ctor, conv) {
  const n = values.length;
  const data = new Ctor(n * (conv.stride || 1));
  values.forEach((v, i) => { if (v != null) conv.set(data, i, v); });
  const nullCount = values.filter((v) => v == null).length;
  return arrow.makeData({ type, length: n, nullCount, nullBitmap: nullCount ? nullBitmap(values) : null, data });
}
function arrowVector(ty, values) {
  const type = arrowType(ty);
  const set = { set: (d, i, v) => { d[i] = v; } };
  switch (ty.t) {
    case 'int64': case 'timestamp': return new arrow.Vector([rawData(type, values, BigInt64Array, { set: (d, i, v) => { d[i] = BigInt(v); } })]);
    case 'uint64': return new arrow.Vector([rawData(type, values, BigUint64Array, { set: (d, i, v) => { d[i] = BigInt(v); } })]);
    case 'time': return new arrow.Vector([ty.unit === 'ms' ? rawData(type, values, Int32Array, set) : rawData(type, values, BigInt64Array, { set: (d, i, v) => { d[i] = BigInt(v); } })]);
    case 'date32': return new arrow.Vector([rawData(type, values, Int32Array, set)]);
    case 'float16': return new arrow.Vector([rawData(type, values, Uint16Array, { set: (d, i, v) => { d[i] = f16bits(v); } })]);
    case 'decimal': return new arrow.Vector([rawData(type, values, Uint32Array, {
      stride: 4, set: (d, i, v) => {
        let [ip, fp = ''] = v.replace('-', '').split('.');
        let big = BigInt(ip + fp.padEnd(ty.s, '0'));
        if (v.startsWith('-')) big = -big;
        big = BigInt.asUintN(128, big);
        for (let k = 0; k < 4; k++) d[i * 4 + k] = Number((big >> BigInt(32 * k)) & 0xffffffffn);
      },
    })]);
    case 'map': return arrow.vectorFromArray(values.map((v) => (v == null ? null : new Map(v))), type);
    default: return arrow.vectorFromArray(values, type);
  }
}
export function toArrowTable(tab) {
  const cols = {};
  for (const c of tab.columns) cols[c.name] = arrowVector(c.type, c.values);
  if (tab.num_rows === 0) {
    const schema = new arrow.Schema(tab.columns.map((c) => new arrow.Field(c.name, arrowType(c.type), true)));
    return new arrow.Table(schema);
  }
  return new arrow.Table(cols);
}
// opts: {compression, dictionary, version, encodings:{col:enc}, dataPageSize, rowGroupSize, batchSize, kv}
export function pwWrite(tab, file, o = {}) {
  const at = toArrowTable(tab);
  const wt = pw.Table.fromIPCStream(arrow.tableToIPC(at, 'stream'));
  let b = new pw.WriterPropertiesBuilder();
  b = b.setCompression(pw.Compression[o.compression || 'UNCOMPRESSED']);
  if (o.dictionary !== undefined) b = b.setDictionaryEnabled(o.dictionary);
  if (o.version) b = b.setWriterVersion(pw.WriterVersion[o.version]);
  for (const [col, enc] of Object.entries(o.encodings || {})) b = b.setColumnDictionaryEnabled(col, false).setColumnEncoding(col, pw.Encoding[enc]);
  if (o.dataPageSize) b = b.setDataPageSizeLimit(o.dataPageSize);
  if (o.rowGroupSize) b = b.setMaxRowGroupSize(o.rowGroupSize);
  if (o.batchSize) b = b.setWriteBatchSize(o.batchSize);
  if (o.kv) b = b.setKeyValueMetadata(new Map(Object.entries(o.kv)));
  const buf = pw.writeParquet(wt, b.build());
  fs.writeFileSync(file, buf);
}

// ================= hyparquet-writer =================
function hwType(ty) {
  return { int32: 'INT32', int64: 'INT64', float: 'FLOAT', double: 'DOUBLE', bool: 'BOOLEAN', string: 'STRING', binary: 'BYTE_ARRAY', float16: 'FLOAT16' }[ty.t];
}
const HW_COMPRESSORS = {
  GZIP: (u8) => new Uint8Array(zlib.gzipSync(u8)),
  BROTLI: (u8) => new Uint8Array(zlib.brotliCompressSync(u8)),
};
// o: {codec, encodings:{col:enc}, rowGroupSize, pageSize, kv}
export function hwWrite(tab, file, o = {}) {
  const columnData = tab.columns.map((c) => {
    let data = c.values;
    if (c.type.t === 'int64') data = data.map((v) => (v == null ? null : BigInt(v)));
    const cd = { name: c.name, data, type: hwType(c.type) };
    if (o.encodings && o.encodings[c.name]) cd.encoding = o.encodings[c.name];
    return cd;
  });
  const ab = parquetWriteBuffer({
    columnData,
    codec: o.codec || 'SNAPPY',
    compressors: HW_COMPRESSORS,
    rowGroupSize: o.rowGroupSize,
    pageSize: o.pageSize,
    kvMetadata: o.kv ? Object.entries(o.kv).map(([key, value]) => ({ key, value })) : undefined,
  });
  fs.writeFileSync(file, Buffer.from(ab));
}
