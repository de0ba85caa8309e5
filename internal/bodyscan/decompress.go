package bodyscan

import (
	"bufio"
	"io"
	"net/http"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/flate"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zlib"
	"github.com/klauspost/compress/zstd"
)

// A compressed response body is read by the body scanner through a
// decompressor: `rate_limit` sits outside `encode` in Caddy's directive
// order, so the tap sees the body as the client gets it, compressed by
// `encode` or by an upstream that compressed it itself. The client's
// Accept-Encoding must not decide what a request is charged.

// maxZstdWindow is the largest zstd window read: 8 MB, the most RFC 9659
// lets a zstd content coding use (Caddy's encode uses 128 KiB). A body
// that needs more keeps the estimate.
const maxZstdWindow = 8 << 20

// contentEncoding is the response's Content-Encoding, lower case, or ""
// for none (or identity).
func contentEncoding(h http.Header) string {
	enc := strings.ToLower(strings.TrimSpace(h.Get("Content-Encoding")))
	if enc == "identity" {
		return ""
	}
	return enc
}

// decoderOf returns the function that opens a decompressing reader for a
// Content-Encoding, or nil for an encoding not read (several encodings
// in one header among them).
func decoderOf(enc string) func(io.Reader) (io.ReadCloser, error) {
	switch enc {
	case "gzip", "x-gzip":
		return func(r io.Reader) (io.ReadCloser, error) { return gzip.NewReader(r) }
	case "zstd":
		return func(r io.Reader) (io.ReadCloser, error) {
			d, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(maxZstdWindow))
			if err != nil {
				return nil, err
			}
			return d.IOReadCloser(), nil
		}
	case "br":
		return func(r io.Reader) (io.ReadCloser, error) { return io.NopCloser(brotli.NewReader(r)), nil }
	case "deflate":
		return openDeflate
	}
	return nil
}

// openDeflate opens a body of Content-Encoding deflate: a zlib stream
// (RFC 1950), as RFC 9110 has it, or a raw deflate stream (RFC 1951), as
// some servers send it. A zlib stream starts with a two-byte header
// whose method is deflate (CM 8), whose window is at most 32 KiB (CINFO
// at most 7), and which is a multiple of 31. A raw stream's first byte
// with that low nibble would start a stored block whose padding bits are
// not zero, which encoders do not write: the test does not mistake one
// for the other.
func openDeflate(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReader(r)
	if h, err := br.Peek(2); err == nil && h[0]&0x0f == 8 && h[0]>>4 <= 7 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

// Readable reports whether the scanner reads a body of content coding
// enc (a coding's name as Accept-Encoding lists it, any case).
func Readable(enc string) bool {
	enc = strings.ToLower(enc)
	return enc == "identity" || decoderOf(enc) != nil
}

// NarrowAcceptEncoding keeps, of a request's Accept-Encoding, only the
// codings the scanner reads (their q-values with them), so that an
// upstream that negotiates answers in one of them: a body in a coding the
// scanner cannot read would keep the estimate, whatever its usage says.
// A list left with no coding becomes "identity" (an absent header would
// accept any), and "*" is dropped. A request without the header is left
// as it is: an upstream answers it uncompressed. It reports whether it
// changed the header.
func NarrowAcceptEncoding(h http.Header) bool {
	values := h.Values("Accept-Encoding")
	if len(values) == 0 {
		return false
	}
	var kept []string
	changed := false
	for _, v := range values {
		for item := range strings.SplitSeq(v, ",") {
			item = strings.TrimSpace(item)
			if item == "" {
				continue
			}
			coding, _, _ := strings.Cut(item, ";")
			if Readable(strings.TrimSpace(coding)) {
				kept = append(kept, item)
			} else {
				changed = true
			}
		}
	}
	if !changed && len(values) == 1 {
		return false
	}
	if len(kept) == 0 {
		kept = append(kept, "identity")
	}
	h.Set("Accept-Encoding", strings.Join(kept, ", "))
	return true
}

// decompressor decompresses the bytes written to it and scans what they
// decompress to. The decompressing readers pull their input, and the tap
// pushes it: a pipe joins the two, and a goroutine per response reads
// the pipe. A write returns once the decompressor has taken its bytes;
// the client has them already (the tap writes to the client first).
type decompressor struct {
	w    *io.PipeWriter
	done chan struct{}
}

// decompress starts scanning the rest of the body through enc's
// decompressor. The goroutine ends when the body does (close), when the
// compressed bytes are malformed, or when the scan turns off (past its
// bound); the writes after that return at once, ignored.
func (s *Scanner) decompress(enc string) {
	pr, pw := io.Pipe()
	d := &decompressor{w: pw, done: make(chan struct{})}
	s.dec = d
	open := decoderOf(enc)
	go func() {
		defer close(d.done)
		defer pr.Close()
		r, err := open(pr)
		if err != nil {
			return
		}
		defer r.Close()
		buf := make([]byte, 16<<10)
		for s.mode != scanOff {
			n, err := r.Read(buf)
			s.scan(buf[:n])
			if err != nil {
				return // io.EOF, or a body cut off or malformed: what was read stands
			}
		}
	}()
}

// write passes p to the decompressor.
func (d *decompressor) write(p []byte) {
	_, _ = d.w.Write(p) // an error: the decompressor stopped reading
}

// close ends the compressed body and waits until everything it
// decompressed to was scanned.
func (d *decompressor) close() {
	d.w.Close()
	<-d.done
}
