package contract

// This file is compiled twice: as part of package contract, and, with its
// package clause rewritten, inside a program that `timing diff` builds in a
// checkout of another revision. It may therefore import the standard library
// only and must not refer to package infra: at an old revision the Timing
// type may have other fields, or methods may be missing.

import (
	"fmt"
	"reflect"
	"sort"
	"time"
)

// Value is one named number of a timing: a field or a derived value.
type Value struct {
	Name string `json:"name"`
	// Kind is "duration" (Int in nanoseconds), "int", or "other" (Text only).
	Kind string `json:"kind"`
	Int  int64  `json:"int"`
	Text string `json:"text"`
}

// Snapshot is a timing as plain data, read by reflection so that any
// revision's Timing can be captured without knowing its fields in advance.
type Snapshot struct {
	Fields []Value `json:"fields"`
	// Derived are the revision's own methods that take no argument and return
	// a time.Duration, in name order.
	Derived []Value `json:"derived"`
	// HasViolations says whether the revision had a Violations method at all.
	HasViolations bool `json:"hasViolations"`
	// Violations are what the revision's own rules say about its timing.
	Violations []string `json:"violations"`
}

var durationType = reflect.TypeOf(time.Duration(0))

// TakeSnapshot reads every exported field of timing, every derived duration
// and, when the type has one, its Violations method.
func TakeSnapshot(timing any) Snapshot {
	v := reflect.ValueOf(timing)
	typ := v.Type()
	s := Snapshot{Fields: []Value{}, Derived: []Value{}, Violations: []string{}}
	if typ.Kind() == reflect.Struct {
		for i := 0; i < typ.NumField(); i++ {
			if f := typ.Field(i); f.IsExported() {
				s.Fields = append(s.Fields, valueOf(f.Name, v.Field(i)))
			}
		}
	}
	var names []string
	for i := 0; i < typ.NumMethod(); i++ {
		m := typ.Method(i)
		// Method types here include the receiver as the first input.
		if m.Type.NumIn() == 1 && m.Type.NumOut() == 1 && m.Type.Out(0) == durationType {
			names = append(names, m.Name)
		}
	}
	sort.Strings(names)
	for _, name := range names {
		s.Derived = append(s.Derived, valueOf(name, v.MethodByName(name).Call(nil)[0]))
	}
	if m := v.MethodByName("Violations"); m.IsValid() && m.Type().NumIn() == 0 &&
		m.Type().NumOut() == 1 && m.Type().Out(0).Kind() == reflect.Slice {
		s.HasViolations = true
		list := m.Call(nil)[0]
		for i := 0; i < list.Len(); i++ {
			item := list.Index(i).Interface()
			if err, ok := item.(error); ok {
				s.Violations = append(s.Violations, err.Error())
			} else {
				s.Violations = append(s.Violations, fmt.Sprint(item))
			}
		}
	}
	return s
}

func valueOf(name string, v reflect.Value) Value {
	switch {
	case v.Type() == durationType:
		d := time.Duration(v.Int())
		return Value{Name: name, Kind: "duration", Int: int64(d), Text: d.String()}
	case v.CanInt():
		return Value{Name: name, Kind: "int", Int: v.Int(), Text: fmt.Sprint(v.Int())}
	default:
		return Value{Name: name, Kind: "other", Text: fmt.Sprint(v.Interface())}
	}
}
