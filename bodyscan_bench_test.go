package tollgate

import (
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2"
)

// BenchmarkBodyScanner is the scanner alone on 10 MB of OpenAI-style
// chunks in 32 KiB writes, with each line end the SSE specification
// allows: what scanning costs a stream, apart from the network.
func BenchmarkBodyScanner(b *testing.B) {
	sse := http.Header{"Content-Type": {"text/event-stream"}}
	for _, end := range []struct{ name, s string }{{"lf", "\n"}, {"crlf", "\r\n"}, {"cr", "\r"}} {
		b.Run("end="+end.name, func(b *testing.B) {
			chunk := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 900) + "\"}}],\"usage\":null}" + end.s + end.s
			var body strings.Builder
			for body.Len() < streamSize {
				body.WriteString(chunk)
			}
			body.WriteString("data: {\"usage\":{\"total_tokens\":12345}}" + end.s + end.s)
			src := []byte(body.String())
			b.SetBytes(int64(len(src)))
			b.ReportAllocs()
			for b.Loop() {
				s := newBodyScanner([]string{"usage.total_tokens"})
				for i := 0; i < len(src); i += 32 << 10 {
					s.feed(sse, src[i:min(len(src), i+32<<10)])
				}
				s.finish(caddy.NewReplacer())
			}
		})
	}
}
