package handle

import (
	"context"
	"testing"
)

type beginner interface{ Begin(context.Context) error }

type ptrBeginner struct{}

func (*ptrBeginner) Begin(context.Context) error { return nil }

type valueBeginner struct{}

func (valueBeginner) Begin(context.Context) error { return nil }

func TestMissing(t *testing.T) {
	var typedNil *ptrBeginner
	var nilIface beginner
	cases := []struct {
		name string
		h    any
		want bool
	}{
		{"untyped nil", nil, true},
		{"nil interface", nilIface, true},
		{"typed nil pointer", beginner(typedNil), true},
		{"nil map", map[string]int(nil), true},
		{"nil func", (func())(nil), true},
		{"pointer", &ptrBeginner{}, false},
		{"value", valueBeginner{}, false},
		{"zero int", 0, false},
	}
	for _, c := range cases {
		if got := Missing(c.h); got != c.want {
			t.Errorf("%s: Missing = %v, want %v", c.name, got, c.want)
		}
	}
}
