#!/usr/bin/env python3
"""Generates the plain C++ message structs and their FlatBuffers read/write code from
proto/dilocod.fbs, so that a message field is written in the schema and nowhere else.

  gen_messages.py SCHEMA.fbs OUT_DIR --io-include HEADER...

writes OUT_DIR/<schema>_messages.h (public: enums, structs, MessageType, MessageBody) and
OUT_DIR/<schema>_messages_io.h (for envelope code only: Write / Read / CheckLists per table,
WriteBody / ReadBody over the union, a static_assert per enum value).

Why not flatc --gen-object-api: its Pack() writes fields largest-first (the wire bytes of v1
would change), schema structs stay accessor classes (no `c.fragment`), enum names and defaults
come from the wire (Role::Invalid, not PeerRole::kLearner), and frame fields cannot be left out.

The schema carries what the C++ side needs as attributes (declared at the top of the .fbs):
  cxx_name: "X"        C++ name of a table, struct or enum (default: the schema name; union
                       members get a "Msg" suffix)
  cxx_external: "h"    enum defined by hand in header h under cxx_name (values are asserted)
  cxx_type: "int"      C++ type of a scalar field; cxx_default: "v" its C++ default (an enum
                       value name, NaN, or a C++ expression)
  cxx_first            this struct field comes first in the C++ struct (positional initialisers)
  max: "fragments"     bound of a list field: ParseOptions::max_<value>; every list has one and
                       it is checked before the list is copied; label: "x" names it in errors
  frame                a field filled from/into the frame struct (table attribute frame_struct)
                       instead of the C++ struct
  create_order / add_order: "a b c"  the order v1 wrote a table's out-of-line fields / added its
                       fields, where not the schema order (tests/fixtures/wire_golden.txt)
Only the subset of the FlatBuffers grammar that the schema uses is read; flatc validates it.
"""
import argparse
import os
import re
import sys

SCALARS = {
    'bool': 'bool', 'byte': 'int8_t', 'ubyte': 'uint8_t', 'short': 'int16_t',
    'ushort': 'uint16_t', 'int': 'int32_t', 'uint': 'uint32_t', 'long': 'int64_t',
    'ulong': 'uint64_t', 'float': 'float', 'double': 'double',
}
TOKEN = re.compile(r'\s*(?:("(?:[^"\\]|\\.)*")|([A-Za-z_][A-Za-z0-9_.]*)|(-?[0-9][0-9.eE+-]*)|(.))')


class SchemaError(Exception):
    pass


class Tokens:
    """Tokens with their line numbers; comments kept per line (leading blocks and trailing)."""

    def __init__(self, text, path):
        self.path = path
        self.toks = []        # (kind, value, line)
        self.leading = {}     # line -> comment lines directly above it
        self.trailing = {}    # line -> comment at its end
        block = []
        for n, raw in enumerate(text.split('\n'), 1):
            code, _, comment = raw.partition('//')
            if not code.strip():
                block = block + [comment.strip()] if comment else []
                continue
            if block:
                self.leading[n] = block
            block = []
            if comment:
                self.trailing[n] = comment.strip()
            pos = 0
            while pos < len(code):
                m = TOKEN.match(code, pos)
                if not m or m.end() == pos:
                    break
                pos = m.end()
                if m.group(1):
                    self.toks.append(('str', m.group(1)[1:-1], n))
                elif m.group(2):
                    self.toks.append(('id', m.group(2), n))
                elif m.group(3):
                    self.toks.append(('num', m.group(3), n))
                elif m.group(4) and not m.group(4).isspace():
                    self.toks.append(('p', m.group(4), n))
        self.i = 0

    def peek(self):
        return self.toks[self.i] if self.i < len(self.toks) else ('eof', '', 0)

    def next(self):
        t = self.peek()
        self.i += 1
        return t

    def expect(self, value):
        t = self.next()
        if t[1] != value:
            raise SchemaError(f'{self.path}:{t[2]}: expected "{value}", got "{t[1]}"')
        return t

    def accept(self, value):
        if self.peek()[1] == value:
            self.i += 1
            return True
        return False


def parse_attrs(tk):
    attrs = {}
    if tk.accept('('):
        while not tk.accept(')'):
            name = tk.next()[1]
            attrs[name] = tk.next()[1] if tk.accept(':') else True
            tk.accept(',')
    return attrs


class Field:
    def __init__(self, name, type_, default, attrs, line, doc, note):
        self.name, self.type, self.default, self.attrs = name, type_, default, attrs
        self.line, self.doc, self.note = line, doc, note


class Decl:
    def __init__(self, kind, name, attrs, line, doc):
        self.kind, self.name, self.attrs, self.line, self.doc = kind, name, attrs, line, doc
        self.fields = []   # tables / structs: Field; enums: (name, value, note); unions: names
        self.base = None   # enums: underlying type


def parse(path):
    tk = Tokens(open(path).read(), path)
    decls = {}
    order = []
    while tk.peek()[0] != 'eof':
        kind, word, line = tk.next()
        if word in ('namespace', 'attribute', 'file_identifier', 'file_extension', 'root_type',
                    'include'):
            while not tk.accept(';'):
                tk.next()
            continue
        if word not in ('table', 'struct', 'enum', 'union'):
            raise SchemaError(f'{path}:{line}: unexpected "{word}"')
        name = tk.next()[1]
        d = Decl(word, name, {}, line, tk.leading.get(line, []))
        if word == 'enum':
            tk.expect(':')
            d.base = tk.next()[1]
        d.attrs = parse_attrs(tk)
        tk.expect('{')
        if word in ('enum', 'union'):
            value = -1
            while not tk.accept('}'):
                vname, vline = tk.next()[1], tk.peek()[2]
                if tk.accept('='):
                    value = int(tk.next()[1])
                else:
                    value += 1
                d.fields.append((vname, value, tk.trailing.get(vline)) if word == 'enum' else vname)
                tk.accept(',')
        else:
            while not tk.accept('}'):
                _, fname, fline = tk.next()
                tk.expect(':')
                if tk.accept('['):
                    ftype = '[' + tk.next()[1] + ']'
                    tk.expect(']')
                else:
                    ftype = tk.next()[1]
                default = tk.next()[1] if tk.accept('=') else None
                fattrs = parse_attrs(tk)
                tk.expect(';')
                d.fields.append(Field(fname, ftype, default, fattrs, fline,
                                      tk.leading.get(fline, []), tk.trailing.get(fline)))
        decls[name] = d
        order.append(d)
    return decls, order


def camel_words(name):
    return re.sub(r'(?<!^)([A-Z])', r' \1', name).lower()


def snake(name):
    return camel_words(name).replace(' ', '_')


class Gen:
    def __init__(self, decls, order, schema_path):
        self.decls, self.order, self.path = decls, order, schema_path
        unions = [d for d in order if d.kind == 'union']
        if len(unions) != 1:
            raise SchemaError(f'{schema_path}: want exactly one union (the message body)')
        self.union = unions[0]
        self.messages = self.union.fields
        for d in order:
            if d.kind in ('table', 'struct'):
                self.check_decl(d)

    def err(self, d, f, msg):
        raise SchemaError(f'{self.path}:{f.line if f else d.line}: {d.name}'
                          f'{"." + f.name if f else ""}: {msg}')

    def check_decl(self, d):
        names = {f.name for f in d.fields}
        for f in d.fields:
            if f.type.startswith('[') and 'max' not in f.attrs:
                self.err(d, f, 'a list needs (max: "...") (ParseOptions::max_...): lists are '
                               'bounded before they are copied')
            if 'frame' in f.attrs and 'frame_struct' not in d.attrs:
                self.err(d, f, 'a frame field needs the table attribute frame_struct')
        for key in ('create_order', 'add_order'):
            for n in d.attrs.get(key, '').split():
                if n not in names:
                    self.err(d, None, f'{key} names "{n}", not a field')

    # ---- names and types ----
    def cxx_name(self, name):
        d = self.decls.get(name)
        if d is None:
            raise SchemaError(f'{self.path}: unknown type {name}')
        if 'cxx_name' in d.attrs:
            return d.attrs['cxx_name']
        return name + 'Msg' if name in self.messages else name

    def kind(self, t):
        if t.startswith('['):
            return 'vector'
        if t in SCALARS:
            return 'scalar'
        if t == 'string':
            return 'string'
        return self.decls[t].kind

    def elem(self, f):
        return f.type[1:-1]

    def cxx_type(self, f):
        if 'cxx_type' in f.attrs:
            return f.attrs['cxx_type']
        t = f.type
        if t.startswith('['):
            e = self.elem(f)
            inner = SCALARS.get(e) or ('std::string' if e == 'string' else self.cxx_name(e))
            return f'std::vector<{inner}>'
        if t in SCALARS:
            return SCALARS[t]
        if t == 'string':
            return 'std::string'
        return self.cxx_name(t)

    def cxx_default(self, f):
        v = f.attrs.get('cxx_default')
        k = self.kind(f.type)
        if v is None and f.default is None:
            return '' if k in ('vector', 'string', 'table') else ' = {}' if k == 'enum' else ' = 0' \
                if f.type != 'bool' else ' = false'
        v = v if v is not None else f.default
        if v == 'NaN':
            return f' = std::numeric_limits<{SCALARS[f.type]}>::quiet_NaN()'
        if k == 'enum':
            return f' = {self.cxx_name(f.type)}::k{v}'
        return f' = {v}'

    def struct_fields(self, d):
        fields = [f for f in d.fields if 'frame' not in f.attrs and self.kind(f.type) != 'union']
        return sorted(fields, key=lambda f: 0 if 'cxx_first' in f.attrs else 1)

    def nan_fields(self, d):
        return {f.name for f in self.struct_fields(d) if f.attrs.get('cxx_default') == 'NaN'}

    # ---- public header ----
    def messages_h(self):
        out = [f'// Generated by proto/gen_messages.py from {os.path.basename(self.path)}: do not edit.',
               '// The plain C++ view of every table of the wire schema (fields documented there).',
               '#pragma once', '', '#include <cmath>', '#include <cstdint>', '#include <limits>',
               '#include <string>', '#include <string_view>', '#include <variant>', '#include <vector>', '']
        for d in self.order:
            if d.kind == 'enum' and 'cxx_external' in d.attrs:
                out.append(f'#include "{d.attrs["cxx_external"]}"')
        out += [f'#include "{h}"' for h in self.includes]
        out += ['', 'namespace diloco {', '']
        out += ['// NaN equals NaN: a field whose default is NaN ("no value yet") round-trips equal.',
                'template <class F>', 'inline bool SameFloat(F a, F b) { return a == b || (std::isnan(a) && std::isnan(b)); }', '']
        for d in self.order:
            if d.kind == 'enum' and 'cxx_external' not in d.attrs:
                out += self.enum_h(d)
            elif d.kind in ('table', 'struct'):
                out += self.struct_h(d)
        m = self.messages
        out.append('// The body types, in the order of the schema\'s union (values = union type values).')
        out.append('enum class MessageType : uint8_t {')
        for i, name in enumerate(m, 1):
            out.append(f'  k{name} = {i},')
        out += ['};', f'inline constexpr int kNumMessageTypes = {len(m)};', '']
        out.append('// Alternatives in MessageType order (index + 1 == MessageType value).')
        out.append('using MessageBody = std::variant<' + ', '.join(self.cxx_name(n) for n in m) + '>;')
        out += ['', 'inline MessageType TypeOf(const MessageBody& body) {',
                '  return static_cast<MessageType>(body.index() + 1);', '}', '']
        out.append('// ' + ', '.join(f'"{camel_words(n)}"' for n in m) + '.')
        out.append('inline std::string_view MessageTypeName(MessageType type) {')
        out.append('  switch (type) {')
        for n in m:
            out.append(f'    case MessageType::k{n}: return "{camel_words(n)}";')
        out += ['  }', '  return "unknown message";', '}', '']
        payload_msgs = [n for n in m if any(f.name == 'payload' for f in self.decls[n].fields)]
        if payload_msgs:
            ptype = self.cxx_type(next(f for f in self.decls[payload_msgs[0]].fields if f.name == 'payload'))
            out.append(f'// The {ptype} of a ' + ', '.join(payload_msgs) + '; nullptr for other bodies.')
            out.append(f'inline const {ptype}* PayloadOf(const MessageBody& body) {{')
            for n in payload_msgs:
                out.append(f'  if (const auto* m = std::get_if<{self.cxx_name(n)}>(&body)) return &m->payload;')
            out += ['  return nullptr;', '}', '']
        out += ['}  // namespace diloco', '']
        return '\n'.join(out)

    def doc(self, lines, indent=''):
        return [f'{indent}// {l}'.rstrip() for l in lines]

    def enum_h(self, d):
        name = self.cxx_name(d.name)
        base = SCALARS[d.base]
        out = self.doc(d.doc)
        out.append(f'enum class {name} : {base} {{')
        valid = []
        for vname, value, note in d.fields:
            if value == 0:
                continue  # value 0 is "invalid" on the wire: no C++ name, rejected by IsValid
            valid.append(vname)
            out.append(f'  k{vname} = {value},' + (f'  // {note}' if note else ''))
        out += ['};', f'// A named {name} value (0 and unknown values are not).',
                f'constexpr bool IsValid({name} v) {{',
                '  return ' + ' || '.join(f'v == {name}::k{v}' for v in valid) + ';', '}', '']
        return out

    def struct_h(self, d):
        name = self.cxx_name(d.name)
        out = self.doc(d.doc)
        out.append(f'struct {name} {{')
        fields = self.struct_fields(d)
        for f in fields:
            out += self.doc(f.doc, '  ')
            out.append(f'  {self.cxx_type(f)} {f.name}{self.cxx_default(f)};' +
                       (f'  // {f.note}' if f.note else ''))
        nan = self.nan_fields(d)
        if nan:
            out.append(f'  bool operator==(const {name}& o) const {{')
            terms = [f'SameFloat({f.name}, o.{f.name})' if f.name in nan
                     else f'{f.name} == o.{f.name}' for f in fields]
            out.append('    return ' + ' &&\n           '.join(terms) + ';')
            out.append('  }')
        else:
            out.append(f'  bool operator==(const {name}&) const = default;')
        out += ['};', '']
        return out

    # ---- io header ----
    def io_h(self, includes, generated_h, messages_h):
        out = [f'// Generated by proto/gen_messages.py from {os.path.basename(self.path)}: do not edit.',
               '// FlatBuffers <-> plain structs for the envelope code only (envelope_io.cpp).',
               '#pragma once', '', '#include <flatbuffers/flatbuffers.h>', '',
               '#include <string>', '#include <string_view>', '#include <vector>', '']
        out += [f'#include "{h}"' for h in includes + [generated_h, messages_h]]
        out += ['', 'namespace diloco::wire_io {', '', 'namespace fb = flatbuffers;',
                'namespace w = diloco::wire;', '']
        out += self.asserts()
        for d in self.order:
            if d.kind == 'table' and 'frame_struct' in d.attrs:
                out.append(f'// What the {d.name} table declares about the frames after the header.')
                out.append(f'struct {d.attrs["frame_struct"]} {{')
                for f in d.fields:
                    if 'frame' in f.attrs:
                        out.append(f'  {SCALARS[f.type]} {f.name} = 0;' + (f'  // {f.note}' if f.note else ''))
                out += ['};', '']
        self.frame = next((d.attrs['frame_struct'] for d in self.order if 'frame_struct' in d.attrs),
                          None)
        if self.frame is None:
            raise SchemaError(f'{self.path}: no table has frame_struct')
        out += ['inline fb::Offset<fb::String> OptString(fb::FlatBufferBuilder& b, const std::string& s) {',
                '  return s.empty() ? fb::Offset<fb::String>() : b.CreateString(s);', '}', '',
                'inline std::string ReadString(const fb::String* s) {',
                '  return s ? std::string(s->c_str(), s->size()) : std::string();', '}', '']
        for d in self.order:
            if d.kind == 'struct':
                out += self.struct_io(d)
            elif d.kind == 'table':
                out += self.write_table(d) + self.read_table(d) + self.check_lists(d)
        out += self.body_dispatch()
        out += ['}  // namespace diloco::wire_io', '']
        return '\n'.join(out)

    def asserts(self):
        out = ['// Every value of every C++ enum equals its wire value (hand-written ones included).']
        for d in self.order:
            if d.kind != 'enum':
                continue
            name = self.cxx_name(d.name)
            for vname, value, _ in d.fields:
                if value == 0:
                    continue
                out.append(f'static_assert(static_cast<int>({name}::k{vname}) == '
                           f'static_cast<int>(w::{d.name}::{vname}));')
            out.append(f'static_assert(static_cast<int>(w::{d.name}::MAX) == {max(v for _, v, _ in d.fields)});')
        for i, n in enumerate(self.messages, 1):
            out.append(f'static_assert(static_cast<int>(w::{self.union.name}::{n}) == {i});')
        out.append(f'static_assert(static_cast<int>(w::{self.union.name}::MAX) == kNumMessageTypes);')
        return out + ['']

    def to_wire(self, f, expr):
        k = self.kind(f.type)
        if k == 'enum':
            return f'static_cast<w::{f.type}>({expr})'
        if 'cxx_type' in f.attrs:
            return f'static_cast<{SCALARS[f.type]}>({expr})'
        return expr

    def from_wire(self, f, expr):
        if self.kind(f.type) == 'enum' or 'cxx_type' in f.attrs:
            return f'static_cast<{self.cxx_type(f)}>({expr})'
        return expr

    def struct_io(self, d):
        name = self.cxx_name(d.name)
        args = ', '.join(self.to_wire(f, f'm.{f.name}') for f in d.fields)
        out = [f'inline w::{d.name} ToWire(const {name}& m) {{ return w::{d.name}({args}); }}', '',
               f'inline void FromWire(const w::{d.name}& s, {name}* m) {{']
        out += [f'  m->{f.name} = {self.from_wire(f, f"s.{f.name}()")};' for f in d.fields]
        return out + ['}', '']

    def union_field(self, d):
        return next((f for f in d.fields if self.kind(f.type) == 'union'), None)

    def write_table(self, d):
        name = self.cxx_name(d.name)
        by_name = {f.name: f for f in d.fields}
        u = self.union_field(d)
        extra = f', w::{u.type} {u.name}_type, fb::Offset<void> {u.name}' if u else ''
        out = [f'inline fb::Offset<w::{d.name}> Write(fb::FlatBufferBuilder& b, const {name}& m,',
               f'                                    [[maybe_unused]] const {self.frame}& f{extra}) {{']
        create = d.attrs.get('create_order', '').split() or [f.name for f in d.fields]
        for fname in create:
            f = by_name[fname]
            k = self.kind(f.type)
            req = 'required' in f.attrs
            v = f'o_{f.name}'
            if k == 'string':
                out.append(f'  auto {v} = ' + (f'b.CreateString(m.{f.name});' if req else f'OptString(b, m.{f.name});'))
            elif k == 'table':
                out.append(f'  auto {v} = Write(b, m.{f.name}, f);')
            elif k == 'vector':
                e = self.elem(f)
                ek = self.kind(e)
                cond = 'true' if req else f'!m.{f.name}.empty()'
                if ek == 'scalar':
                    out.append(f'  fb::Offset<fb::Vector<{SCALARS[e]}>> {v};')
                    out.append(f'  if ({cond}) {v} = b.CreateVector(m.{f.name});')
                elif ek == 'string':
                    out.append(f'  fb::Offset<fb::Vector<fb::Offset<fb::String>>> {v};')
                    out.append(f'  if ({cond}) {v} = b.CreateVectorOfStrings(m.{f.name});')
                elif ek == 'struct':
                    out.append(f'  fb::Offset<fb::Vector<const w::{e}*>> {v};')
                    out += [f'  if ({cond}) {{', f'    std::vector<w::{e}> v;', f'    v.reserve(m.{f.name}.size());',
                            f'    for (const auto& e : m.{f.name}) v.push_back(ToWire(e));',
                            f'    {v} = b.CreateVectorOfStructs(v);', '  }']
                elif ek == 'table':
                    out.append(f'  fb::Offset<fb::Vector<fb::Offset<w::{e}>>> {v};')
                    out += [f'  if ({cond}) {{', f'    std::vector<fb::Offset<w::{e}>> v;', f'    v.reserve(m.{f.name}.size());',
                            f'    for (const auto& e : m.{f.name}) v.push_back(Write(b, e, f));',
                            f'    {v} = b.CreateVector(v);', '  }']
                else:
                    self.err(d, f, f'lists of {ek} are not supported')
        out.append(f'  w::{d.name}Builder t(b);')
        add = d.attrs.get('add_order', '').split() or [f.name for f in d.fields]
        for fname in add:
            f = by_name[fname]
            k = self.kind(f.type)
            if k == 'union':
                out += [f'  t.add_{f.name}_type({f.name}_type);', f'  t.add_{f.name}({f.name});']
            elif 'frame' in f.attrs:
                out.append(f'  t.add_{f.name}(f.{f.name});')
            elif k in ('scalar', 'enum'):
                out.append(f'  t.add_{f.name}({self.to_wire(f, "m." + f.name)});')
            else:
                out.append(f'  t.add_{f.name}(o_{f.name});')
        return out + ['  return t.Finish();', '}', '']

    def label(self, f):
        return f.attrs.get('label', f.name.replace('_', ' '))

    def read_table(self, d):
        name = self.cxx_name(d.name)
        out = [f'inline Status Read(const w::{d.name}* t, [[maybe_unused]] const ParseOptions& o,',
               f'                   [[maybe_unused]] std::string_view who, {name}* m,',
               f'                   [[maybe_unused]] {self.frame}* f) {{']
        for f in d.fields:
            k = self.kind(f.type)
            if k == 'union':
                continue
            if 'frame' in f.attrs:
                out.append(f'  f->{f.name} = t->{f.name}();')
            elif k in ('scalar', 'enum'):
                out.append(f'  m->{f.name} = {self.from_wire(f, f"t->{f.name}()")};')
            elif k == 'string':
                out.append(f'  m->{f.name} = ReadString(t->{f.name}());')
            elif k == 'table':
                what = f'": no {self.label(f)}"'
                out += [f'  if (t->{f.name}() == nullptr) return Status::Error(std::string(who) + {what});',
                        f'  DL_RETURN_IF_ERROR(Read(t->{f.name}(), o, who, &m->{f.name}, f));']
            else:
                e = self.elem(f)
                ek = self.kind(e)
                out += [f'  if (const auto* v = t->{f.name}()) {{',
                        f'    DL_RETURN_IF_ERROR(CheckListSize(v->size(), o.max_{f.attrs["max"]}, who, "{self.label(f)}"));']
                if ek == 'scalar':
                    out.append(f'    m->{f.name}.assign(v->begin(), v->end());')
                elif ek == 'string':
                    out += [f'    m->{f.name}.reserve(v->size());',
                            f'    for (const fb::String* s : *v) m->{f.name}.push_back(ReadString(s));']
                elif ek == 'struct':
                    out += [f'    m->{f.name}.resize(v->size());',
                            f'    for (fb::uoffset_t i = 0; i < v->size(); ++i) FromWire(*v->Get(i), &m->{f.name}[i]);']
                else:
                    out += [f'    m->{f.name}.resize(v->size());',
                            f'    for (fb::uoffset_t i = 0; i < v->size(); ++i) {{',
                            f'      DL_RETURN_IF_ERROR(Read(v->Get(i), o, who, &m->{f.name}[i], f));', '    }']
                out.append('  }')
        return out + ['  return Status::Ok();', '}', '']

    def check_lists(self, d):
        name = self.cxx_name(d.name)
        out = [f'// The list bounds Read checks, on a struct about to be written.',
               f'inline Status CheckLists([[maybe_unused]] const {name}& m, [[maybe_unused]] const ParseOptions& o,',
               f'                         [[maybe_unused]] std::string_view who) {{']
        for f in d.fields:
            k = self.kind(f.type)
            if k == 'vector':
                out.append(f'  DL_RETURN_IF_ERROR(CheckListSize(m.{f.name}.size(), o.max_{f.attrs["max"]}, who, "{self.label(f)}"));')
                if self.kind(self.elem(f)) == 'table':
                    out.append(f'  for (const auto& e : m.{f.name}) DL_RETURN_IF_ERROR(CheckLists(e, o, who));')
            elif k == 'table' and 'frame' not in f.attrs:
                out.append(f'  DL_RETURN_IF_ERROR(CheckLists(m.{f.name}, o, who));')
        return out + ['  return Status::Ok();', '}', '']

    def body_dispatch(self):
        u = self.union.name
        out = ['// Writes the body table; returns its offset (its type is TypeOf(body)).',
               f'inline fb::Offset<void> WriteBody(fb::FlatBufferBuilder& b, const MessageBody& body, const {self.frame}& f) {{',
               '  switch (TypeOf(body)) {']
        for n in self.messages:
            out.append(f'    case MessageType::k{n}: return Write(b, std::get<{self.cxx_name(n)}>(body), f).Union();')
        out += ['  }', '  return fb::Offset<void>();', '}', '',
                '// Copies the body out of a verified envelope, lists bounded before they are copied.',
                f'inline Status ReadBody(const w::{self.root()}* env, MessageType type, const ParseOptions& o,',
                f'                       std::string_view who, MessageBody* body, {self.frame}* f) {{',
                '  switch (type) {']
        for n in self.messages:
            out.append(f'    case MessageType::k{n}: return Read(env->body_as_{n}(), o, who, &body->emplace<{self.cxx_name(n)}>(), f);')
        out += ['  }', '  return Status::Error(std::string(who) + ": unknown body");', '}', '']
        return out

    def root(self):
        for d in self.order:
            if d.kind == 'table' and self.union_field(d):
                return d.name
        raise SchemaError(f'{self.path}: no table holds the union')


def write_if_changed(path, text):
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path, 'w') as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('schema')
    ap.add_argument('out_dir')
    ap.add_argument('--include', action='append', default=[],
                    help='headers the structs need (constants used as defaults)')
    ap.add_argument('--io-include', action='append', default=[],
                    help='headers the io code needs (ParseOptions, CheckListSize, Status)')
    a = ap.parse_args()
    base = os.path.splitext(os.path.basename(a.schema))[0]
    try:
        decls, order = parse(a.schema)
        g = Gen(decls, order, a.schema)
        g.includes = a.include
        os.makedirs(a.out_dir, exist_ok=True)
        write_if_changed(os.path.join(a.out_dir, f'{base}_messages.h'), g.messages_h())
        write_if_changed(os.path.join(a.out_dir, f'{base}_messages_io.h'),
                         g.io_h(a.io_include, f'proto/{base}_generated.h', f'proto/{base}_messages.h'))
    except SchemaError as e:
        print(f'gen_messages.py: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
