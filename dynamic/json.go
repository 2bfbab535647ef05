package dynamic

import (
	"encoding/json"
	"slices"
	"strconv"
)

// MarshalJSON is the JSON encoding/json.Marshal makes of an unstructured
// object's content — byte for byte: map keys sorted, HTML characters
// escaped — made without reflection. Every write is encoded once for its
// body and once for the hash of its content, and encoding/json spends
// most of its time finding out what it is encoding. Values other than the
// unstructured ones (maps of any, slices of any, strings, int64, bool,
// nil) and strings or numbers with anything to escape or format are
// handed to encoding/json, so that the result is the same.
func MarshalJSON(obj map[string]any) ([]byte, error) {
	return appendJSON(make([]byte, 0, 1024), obj) // most children take one allocation
}

// AppendJSON appends MarshalJSON's encoding of obj to b: a caller that
// only hashes the encoding can reuse one buffer.
func AppendJSON(b []byte, obj map[string]any) ([]byte, error) {
	return appendJSON(b, obj)
}

func appendJSON(b []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(b, "null"...), nil
	case bool:
		return strconv.AppendBool(b, v), nil
	case string:
		return appendJSONString(b, v)
	case int64:
		return strconv.AppendInt(b, v, 10), nil
	case int:
		return strconv.AppendInt(b, int64(v), 10), nil
	case int32:
		return strconv.AppendInt(b, int64(v), 10), nil
	case map[string]any:
		if v == nil {
			return append(b, "null"...), nil
		}
		var small [16]string // the keys of most maps, without an allocation
		keys := small[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		b = append(b, '{')
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSONString(b, k); err != nil {
				return nil, err
			}
			b = append(b, ':')
			if b, err = appendJSON(b, v[k]); err != nil {
				return nil, err
			}
		}
		return append(b, '}'), nil
	case []any:
		if v == nil {
			return append(b, "null"...), nil
		}
		b = append(b, '[')
		for i, e := range v {
			if i > 0 {
				b = append(b, ',')
			}
			var err error
			if b, err = appendJSON(b, e); err != nil {
				return nil, err
			}
		}
		return append(b, ']'), nil
	}
	data, err := json.Marshal(v) // float64, and anything else
	if err != nil {
		return nil, err
	}
	return append(b, data...), nil
}

// appendJSONString quotes s as encoding/json does; a string with any
// byte it would escape is left to it.
func appendJSONString(b []byte, s string) ([]byte, error) {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			data, err := json.Marshal(s)
			if err != nil {
				return nil, err
			}
			return append(b, data...), nil
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"'), nil
}
