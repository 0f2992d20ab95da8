mod model;
mod stress;
mod unit;
