package main

import (
	"fmt"
	"reflect"
	"testing"
)

func TestBodyFilter(t *testing.T) {
	f := bodyFilter{}
	msg, kv := f.FilterS("Response Body", []any{"body", `{"data":{"password":"c2VjcmV0"}}`, "verb", "GET"})
	if msg != "Response Body" || !reflect.DeepEqual(kv, []any{"body", omittedBody, "verb", "GET"}) {
		t.Errorf("FilterS = %q %v", msg, kv)
	}
	kept := []any{"body", "not an API body"}
	if _, kv := f.FilterS("Applied child", kept); !reflect.DeepEqual(kv, kept) {
		t.Errorf("FilterS changed another line: %v", kv)
	}
	format, args := f.FilterF("Request Body: %s", []any{"secret"})
	if got := fmt.Sprintf(format, args...); got != "Request Body: "+omittedBody {
		t.Errorf("FilterF = %q", got)
	}
	if got := f.Filter([]any{"Response Body", "secret"}); !reflect.DeepEqual(got, []any{omittedBody}) {
		t.Errorf("Filter = %v", got)
	}
	if got := f.Filter([]any{"Listing", 3}); !reflect.DeepEqual(got, []any{"Listing", 3}) {
		t.Errorf("Filter changed another line: %v", got)
	}
}
