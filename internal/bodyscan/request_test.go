package bodyscan

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestReadDocumentBound: a request document of maxJSONScan bytes is read
// whole, one a byte longer is not, and what was read is replayed to the
// handlers after, the rest of the body with it.
func TestReadDocumentBound(t *testing.T) {
	for _, c := range []struct {
		size int
		ok   bool
	}{{maxJSONScan, true}, {maxJSONScan + 1, false}} {
		body := padded(c.size) + " trailing"
		r := httptest.NewRequest("POST", "/", strings.NewReader(body))
		doc, ok := ReadRequest(r)
		if ok != c.ok || (ok && string(doc) != padded(c.size)) {
			t.Errorf("a document of %d bytes: read %d bytes, ok %v; want ok %v", c.size, len(doc), ok, c.ok)
		}
		rest, err := io.ReadAll(r.Body)
		if err != nil || string(rest) != body {
			t.Errorf("a document of %d bytes: the body replayed is %d bytes (%v), want all %d", c.size, len(rest), err, len(body))
		}
	}
}

// TestReadRequestBodies: a request without a body reads nothing and
// keeps its body; a body that is not one document is replayed whole; and
// closing the replayed body closes the original.
func TestReadRequestBodies(t *testing.T) {
	for _, body := range []io.ReadCloser{nil, http.NoBody} {
		r := &http.Request{Body: body}
		if doc, ok := ReadRequest(r); ok || doc != nil || r.Body != body {
			t.Errorf("body %v: ReadRequest = %q, %v, body now %v; want nothing read, the body kept", body, doc, ok, r.Body)
		}
	}
	orig := &closeCounter{Reader: strings.NewReader(`{"a":1`)}
	r := &http.Request{Body: orig}
	if doc, ok := ReadRequest(r); ok {
		t.Errorf("a body cut off: ReadRequest = %q, true; want not ok", doc)
	}
	if b, _ := io.ReadAll(r.Body); string(b) != `{"a":1` {
		t.Errorf("a body cut off: replayed %q, want all of it", b)
	}
	r.Body.Close()
	if orig.closed != 1 {
		t.Errorf("closing the replayed body closed the original %d times, want 1", orig.closed)
	}
}

type closeCounter struct {
	io.Reader
	closed int
}

func (c *closeCounter) Close() error {
	c.closed++
	return nil
}
