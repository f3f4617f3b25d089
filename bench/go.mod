module github.com/idemkit/idem/bench

go 1.26.0

require github.com/idemkit/idem v0.0.0

replace github.com/idemkit/idem => ../
