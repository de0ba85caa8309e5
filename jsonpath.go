package tollgate

import (
	"bytes"
	"strconv"
)

// jsonNumberAt returns the number at the dotted path segs in the JSON
// document doc (a segment that is a whole number indexes an array),
// without decoding the document or allocating: it walks the document,
// skipping every value off the path. ok is false when the path is
// missing, holds something other than a number (null, say), or the
// document is malformed before the path ends.
func jsonNumberAt(doc []byte, segs []string) (num []byte, ok bool) {
	i := skipSpace(doc, 0)
	for _, seg := range segs {
		if i >= len(doc) {
			return nil, false
		}
		switch doc[i] {
		case '{':
			i, ok = findKey(doc, i+1, seg)
		case '[':
			n, err := strconv.Atoi(seg)
			if err != nil || n < 0 {
				return nil, false
			}
			i, ok = findIndex(doc, i+1, n)
		default:
			return nil, false
		}
		if !ok {
			return nil, false
		}
	}
	if i >= len(doc) {
		return nil, false
	}
	end := i
	for end < len(doc) && bytes.IndexByte([]byte("+-.0123456789eE"), doc[end]) >= 0 {
		end++
	}
	if end == i || (doc[i] != '-' && (doc[i] < '0' || doc[i] > '9')) {
		return nil, false
	}
	return doc[i:end], true
}

// findKey scans the object whose members start at i for key and returns
// the position of its value.
func findKey(doc []byte, i int, key string) (int, bool) {
	for {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] != '"' {
			return 0, false // '}' or malformed: no such key
		}
		end, ok := skipString(doc, i)
		if !ok {
			return 0, false
		}
		name := doc[i+1 : end-1]
		i = skipSpace(doc, end)
		if i >= len(doc) || doc[i] != ':' {
			return 0, false
		}
		i = skipSpace(doc, i+1)
		if string(name) == key {
			return i, true
		}
		if i, ok = nextItem(doc, i); !ok {
			return 0, false
		}
	}
}

// findIndex scans the array whose elements start at i for element n.
func findIndex(doc []byte, i, n int) (int, bool) {
	for k := 0; ; k++ {
		i = skipSpace(doc, i)
		if i >= len(doc) || doc[i] == ']' {
			return 0, false
		}
		if k == n {
			return i, true
		}
		var ok bool
		if i, ok = nextItem(doc, i); !ok {
			return 0, false
		}
	}
}

// nextItem skips the value at i of an object or array and the comma
// after it, and returns where the next member or element starts; false
// at the container's end or on anything else.
func nextItem(doc []byte, i int) (int, bool) {
	i, ok := skipValue(doc, i)
	if !ok {
		return 0, false
	}
	i = skipSpace(doc, i)
	if i >= len(doc) || doc[i] != ',' {
		return 0, false
	}
	return i + 1, true
}

// skipValue returns the position after the value at i.
func skipValue(doc []byte, i int) (int, bool) {
	if i >= len(doc) {
		return 0, false
	}
	switch doc[i] {
	case '"':
		return skipString(doc, i)
	case '{', '[':
		depth := 0
		for i < len(doc) {
			switch doc[i] {
			case '"':
				end, ok := skipString(doc, i)
				if !ok {
					return 0, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return 0, false
	}
	for i < len(doc) && doc[i] != ',' && doc[i] != '}' && doc[i] != ']' && doc[i] != ' ' && doc[i] != '\n' && doc[i] != '\r' && doc[i] != '\t' {
		i++
	}
	return i, true
}

// skipString returns the position after the string starting at i (a '"').
func skipString(doc []byte, i int) (int, bool) {
	for j := i + 1; ; {
		k := bytes.IndexByte(doc[j:], '"')
		if k < 0 {
			return 0, false
		}
		j += k
		// A quote preceded by an odd number of backslashes is escaped.
		bs := 0
		for b := j - 1; b > i && doc[b] == '\\'; b-- {
			bs++
		}
		if bs%2 == 0 {
			return j + 1, true
		}
		j++
	}
}

func skipSpace(doc []byte, i int) int {
	for i < len(doc) && (doc[i] == ' ' || doc[i] == '\n' || doc[i] == '\r' || doc[i] == '\t') {
		i++
	}
	return i
}
